"""`deltabus cluster scale` and `deltabus cluster balance`: brokers joining and leaving a running
cluster, and the balancer's plan. Kafka has no tool for either (brokers are added by hand and
partitions moved with kafka-reassign-partitions.sh or Cruise Control); the plan prints as
kafka-reassign-partitions.sh --generate prints its proposal, Kafka's reassignment JSON, so it can
be saved, edited and run with `deltabus reassign-partitions --execute`.
"""

from __future__ import annotations

import argparse
import json
import time

from deltabus.cli.options import CliError, add_command_config, admin_settings
from deltabus.client.admin import AdminClient
from deltabus.metadata import BalancePlan, BrokerLoad

POLL_S = 0.5
DONE, FAILED = "done", "failed"


def add_parsers(commands: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    s = commands.add_parser("scale", parents=[parent],
                            help="add or remove brokers of a running cluster")
    what = s.add_mutually_exclusive_group(required=True)
    what.add_argument("--brokers", type=int, metavar="N",
                      help="the broker count to run: new brokers take their share of the "
                           "partitions; leaving ones (the highest ids) are drained, then stopped")
    what.add_argument("--describe", action="store_true", help="how the last scale went")
    s.add_argument("--no-wait", action="store_true",
                   help="return once the scale has started instead of when it is done")
    add_command_config(s, clients="admin")
    s.set_defaults(func=scale)
    b = commands.add_parser("balance", parents=[parent],
                            help="spread replicas and leaders over the brokers")
    actions = b.add_mutually_exclusive_group(required=True)
    actions.add_argument("--dry-run", action="store_true",
                         help="print the plan (Kafka's reassignment JSON) and the spread")
    actions.add_argument("--execute", action="store_true", help="start the plan's moves")
    add_command_config(b, clients="admin")
    b.set_defaults(func=balance)


def scale(args: argparse.Namespace) -> int:
    if args.brokers is not None and args.brokers < 1:
        raise CliError(f"--brokers must be at least 1, not {args.brokers}")
    with AdminClient(args.bootstrap_server, **admin_settings(args)) as admin:
        if args.describe:
            status = admin.scale_cluster()
            print(f"State: {status.state}\tBrokers: {status.brokers}\t"
                  f"Members: {list(status.members)}\tStep: {status.step}")
            return 1 if status.state == FAILED else 0
        before = admin.scale_cluster()
        status = admin.scale_cluster(args.brokers)
        print(f"Scaling the cluster from {len(before.members)} to {args.brokers} brokers.",
              flush=True)
        if args.no_wait:
            return 0
        step = ""
        while status.state not in (DONE, FAILED):
            if status.step != step:
                step = status.step
                print(f"  {step}", flush=True)
            time.sleep(POLL_S)
            status = admin.scale_cluster()
    if status.state == FAILED:
        raise CliError(f"Scaling to {args.brokers} brokers failed: {status.step}")
    print(f"The cluster runs {len(status.members)} brokers: "
          f"{', '.join(str(b) for b in status.members)}.")
    return 0


def balance(args: argparse.Namespace) -> int:
    with AdminClient(args.bootstrap_server, **admin_settings(args)) as admin:
        plan = admin.balance_cluster(execute=args.execute)
    if not plan.moves:
        print("The cluster is balanced: no partition needs to move.")
    elif args.dry_run:
        print("Proposed partition reassignment configuration\n")
        print(json.dumps(plan.reassignment_json(), separators=(",", ":")))
        print()
    else:
        print(f"Successfully started partition reassignments for {len(plan.moves)} partitions "
              f"({plan.copies} replicas to copy); `deltabus topics --describe` shows them "
              "until they complete.")
    print_spread(plan)
    if plan.unmet:
        print(f"Goals not met: {', '.join(plan.unmet)}")
    return 0


def print_spread(plan: BalancePlan) -> None:
    """Each broker's replicas, leaders and bytes in, before and after the plan."""
    after = {load.broker_id: load for load in plan.after}
    print(f"{'BROKER':<8}{'RACK':<12}{'REPLICAS':<16}{'LEADERS':<16}BYTES-IN/S")
    for load in plan.before:
        new = after.get(load.broker_id, BrokerLoad(load.broker_id, load.rack, 0, 0, 0.0))
        print(f"{load.broker_id:<8}{load.rack or '-':<12}"
              f"{_change(load.replicas, new.replicas):<16}"
              f"{_change(load.leaders, new.leaders):<16}"
              f"{_change(round(load.bytes_in_per_s), round(new.bytes_in_per_s))}")


def _change(before: int, after: int) -> str:
    return str(before) if before == after else f"{before} -> {after}"
