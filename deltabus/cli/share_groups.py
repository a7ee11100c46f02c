"""`deltabus share-groups`: Kafka's kafka-share-groups.sh (Kafka 4.2) over AdminClient.

Same flags and columns: `--list` (with `--state` for the STATE column); `--describe --group G`
with the offsets view (GROUP, TOPIC, PARTITION, START-OFFSET, LAG; `--verbose` adds
LEADER-EPOCH), `--members` (GROUP, CONSUMER-ID, HOST, CLIENT-ID, #PARTITIONS, ASSIGNMENT;
`--verbose` adds MEMBER-EPOCH) or `--state` (GROUP, COORDINATOR (ID), STATE, #MEMBERS;
`--verbose` adds GROUP-EPOCH and ASSIGNMENT-EPOCH); `--reset-offsets` with `--to-earliest`,
`--to-latest` or `--to-datetime`, a dry run unless `--execute`, refused while the group has
members; `--delete-offsets --topic T`; `--delete`.
"""

from __future__ import annotations

import argparse
import sys

from deltabus import errors
from deltabus.cli.consumer_groups import _print_table, _timestamp_ms
from deltabus.cli.options import CliError, add_command_config, admin_settings
from deltabus.client.admin import AdminClient
from deltabus.client.consumer import Consumer, TopicPartition
from deltabus.metadata import ShareGroupDescription


def add_parser(subparsers: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser("share-groups", parents=[parent],
                              help="list, describe, reset and delete share groups "
                                   "(kafka-share-groups.sh)")
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--list", action="store_true", help="list all share groups")
    action.add_argument("--describe", action="store_true", help="describe share group(s)")
    action.add_argument("--reset-offsets", action="store_true",
                        help="reset a group's start offsets (dry run unless --execute)")
    action.add_argument("--delete-offsets", action="store_true",
                        help="delete a group's offsets in topics (--topic)")
    action.add_argument("--delete", action="store_true", help="delete share group(s)")
    p.add_argument("--group", action="append", default=[], help="the share group")
    p.add_argument("--all-groups", action="store_true", help="every share group")
    p.add_argument("--topic", action="append", default=[],
                   help="a topic, or topic:0,1 for some partitions")
    p.add_argument("--all-topics", action="store_true",
                   help="with --reset-offsets: every topic the group started")
    view = p.add_mutually_exclusive_group()
    view.add_argument("--members", action="store_true", help="describe the members")
    view.add_argument("--state", action="store_true", help="the groups' state")
    view.add_argument("--offsets", action="store_true", help="describe offsets (default)")
    p.add_argument("--verbose", action="store_true", help="more columns")
    scenario = p.add_mutually_exclusive_group()
    scenario.add_argument("--to-earliest", action="store_true")
    scenario.add_argument("--to-latest", action="store_true")
    scenario.add_argument("--to-datetime", metavar="YYYY-MM-DDTHH:mm:SS.sss")
    run_mode = p.add_mutually_exclusive_group()
    run_mode.add_argument("--dry-run", action="store_true", help="show the result (default)")
    run_mode.add_argument("--execute", action="store_true", help="reset the offsets")
    add_command_config(p, clients="admin")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with AdminClient(args.bootstrap_server, **admin_settings(args)) as admin:
        if args.list:
            listed = admin.list_share_groups()
            if args.state:
                _print_table([["GROUP", "STATE"], *([g, s] for g, s in listed)])
            else:
                for group_id, _ in listed:
                    print(group_id)
            return 0
        groups = _groups(admin, args)
        if args.describe:
            describe(admin, args, groups)
        elif args.reset_offsets:
            reset_offsets(admin, args, groups)
        elif args.delete_offsets:
            delete_offsets(admin, args, groups)
        else:
            delete(admin, groups)
    return 0


def _groups(admin: AdminClient, args: argparse.Namespace) -> list[str]:
    if args.all_groups:
        return [g for g, _ in admin.list_share_groups()]
    if not args.group:
        raise CliError("Option [describe|reset-offsets|delete-offsets|delete] takes one of "
                       "these options: [all-groups], [group]")
    return list(args.group)


# ---- describe --------------------------------------------------------------------------------


def describe(admin: AdminClient, args: argparse.Namespace, groups: list[str]) -> None:
    for group_id in groups:
        description = _description(admin, group_id)
        if description is None:
            raise CliError(f"Share group '{group_id}' does not exist.")
        print()
        if args.state:
            _print_state(admin, description, args.verbose)
        elif args.members:
            if not description.members:
                print(f"Share group '{group_id}' has no active members.", file=sys.stderr)
                continue
            _print_members(description, args.verbose)
        else:
            _print_offsets(admin, group_id, args.verbose)


def _description(admin: AdminClient, group_id: str) -> ShareGroupDescription | None:
    """The group as its coordinator describes it; one known only by its offsets (no member
    since the coordinator started) is Empty; None: no such share group."""
    try:
        return admin.describe_share_groups([group_id])[0]
    except errors.GroupIdNotFoundError:
        if group_id in {g for g, _ in admin.list_share_groups()}:
            return ShareGroupDescription(group_id, "Empty", 0, 0, "simple", [])
        return None


def _print_offsets(admin: AdminClient, group_id: str, verbose: bool) -> None:
    offsets = admin.list_share_group_offsets(group_id)
    if not offsets:
        print(f"Share group '{group_id}' has no offset information.")
        return
    header = ["GROUP", "TOPIC", "PARTITION"] + (["LEADER-EPOCH"] if verbose else []) + \
        ["START-OFFSET", "LAG"]
    rows = [header]
    for (topic, partition), o in sorted(offsets.items()):
        rows.append([group_id, topic, str(partition)]
                    + ([_dash(o.leader_epoch)] if verbose else [])
                    + [_dash(o.start_offset), _dash(o.lag)])
    _print_table(rows)


def _print_members(description: ShareGroupDescription, verbose: bool) -> None:
    header = ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"] + \
        (["MEMBER-EPOCH"] if verbose else []) + ["ASSIGNMENT"]
    rows = [header]
    for m in sorted(description.members, key=lambda m: m.member_id):
        assigned = ";".join(f"{t}:{','.join(map(str, sorted(ps)))}"
                            for t, ps in sorted(m.assignment.items())) or "-"
        rows.append([description.group_id, m.member_id, m.client_host or "-",
                     m.client_id or "-", str(sum(len(ps) for ps in m.assignment.values()))]
                    + ([str(m.member_epoch)] if verbose else []) + [assigned])
    _print_table(rows)


def _print_state(admin: AdminClient, description: ShareGroupDescription, verbose: bool) -> None:
    found = admin.describe_cluster()
    header = ["GROUP", "COORDINATOR (ID)", "STATE"] + \
        (["GROUP-EPOCH", "ASSIGNMENT-EPOCH"] if verbose else []) + ["#MEMBERS"]
    row = [description.group_id, f"controller ({found['controller_id']})", description.state] \
        + ([str(description.group_epoch), str(description.assignment_epoch)] if verbose
           else []) + [str(len(description.members))]
    _print_table([header, row])


def _dash(value: int) -> str:
    return "-" if value < 0 else str(value)


# ---- reset and delete offsets ----------------------------------------------------------------


def reset_offsets(admin: AdminClient, args: argparse.Namespace, groups: list[str]) -> None:
    if not (args.to_earliest or args.to_latest or args.to_datetime):
        raise CliError("Option [reset-offsets] takes one of these options: [to-datetime], "
                       "[to-earliest], [to-latest]")
    if not args.topic and not args.all_topics:
        raise CliError("Option [reset-offsets] takes one of these options: [all-topics], "
                       "[topic]")
    rows = [["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"]]
    for group_id in groups:
        found = _description(admin, group_id)
        if found is not None and found.members:
            raise CliError(f"Share group '{group_id}' is not empty.")
        partitions = (sorted(TopicPartition(*tp) for tp in admin.list_share_group_offsets(
            group_id)) if args.all_topics else _topic_partitions(args))
        new = _new_offsets(args, partitions)
        if args.execute:
            failed = {tp: e for tp, e in admin.alter_share_group_offsets(
                group_id, {(tp.topic, tp.partition): o for tp, o in new.items()}).items() if e}
            if failed:
                raise CliError("; ".join(f"{t}-{p}: {e}" for (t, p), e in failed.items()))
        rows += [[group_id, tp.topic, str(tp.partition), str(o)]
                 for tp, o in sorted(new.items())]
    print()
    _print_table(rows)


def _topic_partitions(args: argparse.Namespace) -> list[TopicPartition]:
    out: list[TopicPartition] = []
    with Consumer(args.bootstrap_server, **admin_settings(args)) as consumer:
        existing = set(consumer.topics())
        for spec in args.topic:
            topic, _, parts = spec.partition(":")
            if topic not in existing:
                raise CliError(f'The partitions "{spec}" do not exist')
            out += ([TopicPartition(topic, int(p)) for p in parts.split(",")] if parts else
                    [TopicPartition(topic, p)
                     for p in sorted(consumer.partitions_for_topic(topic))])
    return out


def _new_offsets(args: argparse.Namespace,
                 partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
    with Consumer(args.bootstrap_server, **admin_settings(args)) as consumer:
        if args.to_earliest:
            return consumer.beginning_offsets(partitions)
        ends = consumer.end_offsets(partitions)
        if args.to_latest:
            return ends
        ms = _timestamp_ms(args.to_datetime)
        found = consumer.offsets_for_times({tp: ms for tp in partitions})
        for tp in partitions:
            if found[tp] < 0:
                print(f"\nWarn: Partition {tp.partition} from topic {tp.topic} is empty. "
                      "Falling back to latest known offset.")
        return {tp: found[tp] if found[tp] >= 0 else ends[tp] for tp in partitions}


def delete_offsets(admin: AdminClient, args: argparse.Namespace, groups: list[str]) -> None:
    if not args.topic:
        raise CliError("Option [delete-offsets] takes the following options: [group], [topic]")
    topics = [spec.partition(":")[0] for spec in args.topic]
    for group_id in groups:
        results = admin.delete_share_group_offsets(group_id, topics)
        print()
        _print_table([["TOPIC", "STATUS"], *([t, "Successful" if e is None else f"Error: {e}"]
                                             for t, e in sorted(results.items()))])


def delete(admin: AdminClient, groups: list[str]) -> None:
    results = admin.delete_consumer_groups(groups)
    failed = {g: e for g, e in results.items() if e is not None}
    deleted = [g for g, e in results.items() if e is None]
    if not failed:
        names = ", ".join(f"'{g}'" for g in deleted)
        print(f"Deletion of requested share groups ({names}) was successful.")
        return
    print("\nError: Deletion of some share groups failed:")
    for group_id, error in failed.items():
        print(f"* Group '{group_id}' could not be deleted due to: {error}")
    if deleted:
        print("\nThese share groups were deleted successfully: "
              + ", ".join(f"'{g}'" for g in deleted))
    raise CliError(f"{len(failed)} group(s) could not be deleted")
