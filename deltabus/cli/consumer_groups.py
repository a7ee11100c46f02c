"""`deltabus consumer-groups`: Kafka's kafka-consumer-groups.sh over AdminClient.

Same flags and the same columns: `--list`; `--describe --group G` (GROUP, TOPIC, PARTITION,
CURRENT-OFFSET, LOG-END-OFFSET, LAG, CONSUMER-ID, HOST, CLIENT-ID), with `--members` or `--state`
for the other views; `--reset-offsets` with one scenario (`--to-earliest`, `--to-latest`,
`--to-offset`, `--shift-by`, `--to-datetime`, `--by-duration`, `--to-current`), a dry run unless
`--execute`, refused while the group has active members, as Kafka refuses it; `--delete`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
from collections.abc import Iterable

from deltabus.cli.options import CliError, add_command_config, admin_settings
from deltabus.client.admin import AdminClient
from deltabus.client.consumer import Consumer, TopicPartition
from deltabus.client.consumer_protocol import Assignment
from deltabus.metadata import GroupDescription

SCENARIOS = ("to_earliest", "to_latest", "to_offset", "shift_by", "to_datetime", "by_duration",
             "to_current")


def add_parser(subparsers: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser("consumer-groups", parents=[parent],
                              help="list, describe, reset and delete consumer groups "
                                   "(kafka-consumer-groups.sh)")
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--list", action="store_true", help="list all consumer groups")
    action.add_argument("--describe", action="store_true", help="describe consumer group(s)")
    action.add_argument("--reset-offsets", action="store_true",
                        help="reset a group's committed offsets (dry run unless --execute)")
    action.add_argument("--delete", action="store_true", help="delete consumer group(s)")
    p.add_argument("--group", action="append", default=[], help="the consumer group")
    p.add_argument("--all-groups", action="store_true", help="every consumer group")
    p.add_argument("--topic", action="append", default=[],
                   help="with --reset-offsets: a topic, or topic:0,1 for some partitions")
    p.add_argument("--all-topics", action="store_true",
                   help="with --reset-offsets: every topic the group committed")
    view = p.add_mutually_exclusive_group()
    view.add_argument("--members", action="store_true", help="describe the members")
    view.add_argument("--state", action="store_true", help="describe the group's state")
    view.add_argument("--offsets", action="store_true", help="describe offsets (default)")
    p.add_argument("--verbose", action="store_true", help="with --members: the assignments too")
    scenario = p.add_mutually_exclusive_group()
    scenario.add_argument("--to-earliest", action="store_true")
    scenario.add_argument("--to-latest", action="store_true")
    scenario.add_argument("--to-current", action="store_true")
    scenario.add_argument("--to-offset", type=int, metavar="OFFSET")
    scenario.add_argument("--shift-by", type=int, metavar="N")
    scenario.add_argument("--to-datetime", metavar="YYYY-MM-DDTHH:mm:SS.sss")
    scenario.add_argument("--by-duration", metavar="PnDTnHnMnS")
    run_mode = p.add_mutually_exclusive_group()
    run_mode.add_argument("--dry-run", action="store_true", help="show the result (default)")
    run_mode.add_argument("--execute", action="store_true", help="reset the offsets")
    add_command_config(p, clients="admin")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with AdminClient(args.bootstrap_server, **admin_settings(args)) as admin:
        if args.list:
            for group_id, _ in admin.list_consumer_groups():
                print(group_id)
            return 0
        groups = _groups(admin, args)
        if args.describe:
            describe(admin, args, groups)
        elif args.reset_offsets:
            reset_offsets(admin, args, groups)
        else:
            delete(admin, groups)
    return 0


def _groups(admin: AdminClient, args: argparse.Namespace) -> list[str]:
    if args.all_groups:
        return [g for g, _ in admin.list_consumer_groups()]
    if not args.group:
        raise CliError("Option [describe|reset-offsets|delete] takes one of these options: "
                       "[all-groups], [group]")
    return list(args.group)


# ---- describe --------------------------------------------------------------------------------


def describe(admin: AdminClient, args: argparse.Namespace, groups: list[str]) -> None:
    for description in admin.describe_consumer_groups(groups):
        if description.state == "Dead":
            raise CliError(f"Consumer group '{description.group_id}' does not exist.")
        print()
        if args.state:
            _print_state(admin, description)
            continue
        if not description.members:
            print(f"Consumer group '{description.group_id}' has no active members.")
        elif description.state != "Stable":
            print(f"Warning: Consumer group '{description.group_id}' is rebalancing.")
        if args.members:
            _print_members(description, args.verbose)
        else:
            _print_offsets(admin, args, description)


def assignments(description: GroupDescription) -> dict[TopicPartition, tuple[str, str, str]]:
    """Each assigned partition's (consumer id, host, client id)."""
    out = {}
    for m in description.members:
        for topic, partitions in Assignment.decode(m.assignment).partitions:
            for p in partitions:
                out[TopicPartition(topic, p)] = (m.member_id, m.client_host, m.client_id)
    return out


def _print_offsets(admin: AdminClient, args: argparse.Namespace,
                   description: GroupDescription) -> None:
    committed = admin.list_consumer_group_offsets(description.group_id)
    owners = assignments(description)
    tps = sorted({TopicPartition(*tp) for tp in committed} | set(owners))
    ends = _end_offsets(args, tps)
    rows = [["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
             "CONSUMER-ID", "HOST", "CLIENT-ID"]]
    for tp in tps:
        current = committed.get(tp)
        end = ends.get(tp)
        lag = end - current if current is not None and end is not None else None
        owner = owners.get(tp, ("-", "-", "-"))
        rows.append([description.group_id, tp.topic, str(tp.partition), _dash(current),
                     _dash(end), _dash(lag), *owner])
    _print_table(rows)


def _end_offsets(args: argparse.Namespace,
                 tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    if not tps:
        return {}
    with Consumer(args.bootstrap_server, **admin_settings(args)) as consumer:
        existing = set(consumer.topics())
        return consumer.end_offsets([tp for tp in tps if tp.topic in existing])


def _print_members(description: GroupDescription, verbose: bool) -> None:
    header = ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]
    rows = [header + (["ASSIGNMENT"] if verbose else [])]
    for m in description.members:
        assigned = Assignment.decode(m.assignment).partitions
        row = [description.group_id, m.member_id, m.client_host, m.client_id,
               str(sum(len(ps) for _, ps in assigned))]
        if verbose:
            row.append(", ".join(f"{t}({','.join(map(str, ps))})" for t, ps in assigned) or "-")
        rows.append(row)
    _print_table(rows)


def _print_state(admin: AdminClient, description: GroupDescription) -> None:
    found = admin.describe_cluster()
    rows = [["GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"],
            [description.group_id, f"controller ({found['controller_id']})",
             description.protocol or "", description.state, str(len(description.members))]]
    _print_table(rows)


def _print_table(rows: list[list[str]]) -> None:
    """Kafka's layout: left-aligned columns, each as wide as its widest cell plus a space."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print(" ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())


def _dash(value: int | None) -> str:
    return "-" if value is None else str(value)


# ---- reset offsets ---------------------------------------------------------------------------


def reset_offsets(admin: AdminClient, args: argparse.Namespace, groups: list[str]) -> None:
    chosen = [s for s in SCENARIOS if getattr(args, s) not in (None, False)]
    if not chosen:
        raise CliError("One of the reset scopes should be defined: --to-datetime, "
                       "--by-duration, --to-earliest, --to-latest, --shift-by, --to-offset, "
                       "--to-current")
    if not args.topic and not args.all_topics:
        raise CliError("One of the reset scopes should be defined: --all-topics, --topic.")
    rows = [["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"]]
    for description in admin.describe_consumer_groups(groups):
        if description.members:
            raise CliError(
                f"Assignments can only be reset if the group '{description.group_id}' is "
                f"inactive, but the current state is {description.state}.")
        committed = {TopicPartition(*tp): o for tp, o in
                     admin.list_consumer_group_offsets(description.group_id).items()}
        tps = _reset_partitions(args, committed)
        new = _new_offsets(args, chosen[0], tps, committed)
        if args.execute:
            admin.alter_consumer_group_offsets(description.group_id, dict(new.items()))
        rows += [[description.group_id, tp.topic, str(tp.partition), str(o)]
                 for tp, o in sorted(new.items())]
    print()
    _print_table(rows)


def _reset_partitions(args: argparse.Namespace,
                      committed: dict[TopicPartition, int]) -> list[TopicPartition]:
    if args.all_topics:
        return sorted(committed)
    out: list[TopicPartition] = []
    with Consumer(args.bootstrap_server, **admin_settings(args)) as consumer:
        for spec in args.topic:
            topic, _, parts = spec.partition(":")
            if parts:
                out += [TopicPartition(topic, int(p)) for p in parts.split(",")]
            else:
                out += [TopicPartition(topic, p)
                        for p in sorted(consumer.partitions_for_topic(topic))]
    return out


def _new_offsets(args: argparse.Namespace, scenario: str, tps: list[TopicPartition],
                 committed: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
    """Kafka's reset scenarios, clamped to [log start, log end] as Kafka clamps them."""
    with Consumer(args.bootstrap_server, **admin_settings(args)) as consumer:
        starts = consumer.beginning_offsets(tps)
        ends = consumer.end_offsets(tps)
        if scenario in ("to_datetime", "by_duration"):
            ms = _timestamp_ms(args.to_datetime) if scenario == "to_datetime" else \
                int((dt.datetime.now(dt.UTC) - _duration(args.by_duration)).timestamp() * 1000)
            found = consumer.offsets_for_times({tp: ms for tp in tps})
            return {tp: found[tp] if found[tp] >= 0 else ends[tp] for tp in tps}
    out = {}
    for tp in tps:
        current = committed.get(tp, ends[tp])
        target = {"to_earliest": starts[tp], "to_latest": ends[tp], "to_current": current,
                  "to_offset": args.to_offset,
                  "shift_by": current + (args.shift_by or 0)}[scenario]
        out[tp] = min(max(target, starts[tp]), ends[tp])
    return out


def _timestamp_ms(text: str) -> int:
    """Kafka's --to-datetime format, 'YYYY-MM-DDTHH:mm:SS.sss', with an optional zone (UTC
    when none is given)."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise CliError(f"Error parsing datetime '{text}': expected YYYY-MM-DDTHH:mm:SS.sss") \
            from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


_DURATION = re.compile(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?")


def _duration(text: str) -> dt.timedelta:
    """An ISO-8601 duration as Kafka's --by-duration takes it: PnDTnHnMnS."""
    match = _DURATION.fullmatch(text or "")
    if not match or text in ("P", "PT"):
        raise CliError(f"Error parsing duration '{text}': expected PnDTnHnMnS, e.g. PT1H30M")
    days, hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return dt.timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)


# ---- delete ----------------------------------------------------------------------------------


def delete(admin: AdminClient, groups: Iterable[str]) -> None:
    results = admin.delete_consumer_groups(groups)
    failed = {g: e for g, e in results.items() if e is not None}
    deleted = [g for g, e in results.items() if e is None]
    if deleted:
        names = ", ".join(f"'{g}'" for g in deleted)
        print(f"Deletion of requested consumer groups ({names}) was successful.")
    for group_id, error in failed.items():
        print(f"Error: Deletion of some consumer groups failed:\n* Group '{group_id}' "
              f"could not be deleted due to: {error}")
    if failed:
        raise CliError(f"{len(failed)} group(s) could not be deleted")
