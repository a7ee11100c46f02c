"""`deltabus reassign-partitions`: Kafka's kafka-reassign-partitions.sh (--execute and --verify).

Takes Kafka's reassignment JSON ({"version": 1, "partitions": [{"topic": ..., "partition": ...,
"replicas": [...]}]}). --execute prints the current assignment (to save for a rollback) and starts
the moves: new replicas are caught up by a Spark job copying the leader's Delta files, join the
ISR, and then the replicas left out are dropped. --verify says which moves are done.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from deltabus.cli.options import CliError, add_command_config, admin_settings
from deltabus.client.admin import AdminClient


def add_parser(subparsers: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser("reassign-partitions", parents=[parent],
                              help="move or add partition replicas "
                                   "(kafka-reassign-partitions.sh)")
    actions = p.add_mutually_exclusive_group()
    actions.add_argument("--execute", action="store_true", help="start the reassignment")
    actions.add_argument("--verify", action="store_true", help="report its progress")
    p.add_argument("--reassignment-json-file", metavar="FILE", required=True,
                   help="Kafka's reassignment JSON: the target replicas of each partition")
    add_command_config(p, clients="admin")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not (args.execute or args.verify):
        raise CliError("Command must include exactly one action: --execute or --verify")
    targets = read_plan(args.reassignment_json_file)
    with AdminClient(args.bootstrap_server, **admin_settings(args)) as admin:
        topics = {t.name: t for t in admin.describe_topics(sorted({t for t, _ in targets}))}
        if args.verify:
            print("Status of partition reassignment:")
            for (topic, partition), replicas in targets.items():
                state = topics[topic].partitions[partition]
                done = (list(state.replicas) == replicas and not state.adding_replicas
                        and not state.removing_replicas)
                print(f"Reassignment of partition {topic}-{partition} is "
                      f"{'completed' if done else 'still in progress'}.")
            return 0
        current = {"version": 1, "partitions": [
            {"topic": t, "partition": p, "replicas": list(topics[t].partitions[p].replicas),
             "log_dirs": ["any"] * len(topics[t].partitions[p].replicas)}
            for t, p in targets]}
        print("Current partition replica assignment\n")
        print(json.dumps(current, separators=(",", ":")))
        print("\nSave this to use as the --reassignment-json-file option during rollback")
        results = admin.alter_partition_reassignments(targets)
    failed = {tp: e for tp, e in results.items() if e is not None}
    started = [f"{t}-{p}" for (t, p), e in results.items() if e is None]
    if started:
        print(f"Successfully started partition reassignments for {','.join(started)}")
    for (t, p), error in failed.items():
        print(f"Error reassigning partition(s):\n{t}-{p}: {error}")
    if failed:
        raise CliError(f"{len(failed)} partition reassignment(s) could not be started")
    return 0


def read_plan(path: str) -> dict[tuple[str, int], list[int]]:
    try:
        with open(path) as f:
            plan: Any = json.load(f)
        return {(str(p["topic"]), int(p["partition"])): [int(r) for r in p["replicas"]]
                for p in plan["partitions"]}
    except OSError as e:
        raise CliError(f"cannot read {path}: {e.strerror}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise CliError(f"{path} is not a reassignment JSON file "
                       f'({{"version":1,"partitions":[{{"topic":...,"partition":...,'
                       f'"replicas":[...]}}]}}): {e}') from None
