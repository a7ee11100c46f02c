"""`deltabus topics`: Kafka's kafka-topics.sh over AdminClient.

Output is byte for byte what Kafka 3.x prints (`Created topic T.`, the tab-separated describe
lines), so scripts that parse kafka-topics output keep working. As in Kafka, `--topic` is a regular
expression for --list, --describe and --delete, and a literal name for --create.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable

from deltabus import errors
from deltabus.cli.options import (
    CliError,
    add_command_config,
    admin_settings,
    parse_properties,
    warn,
)
from deltabus.client.admin import AdminClient
from deltabus.metadata import NO_LEADER, NewTopic, PartitionState, TopicState
from deltabus.topics import has_collision_chars, validate_topic_name

ACTIONS = ("create", "list", "describe", "delete", "alter")


def add_parser(subparsers: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser("topics", parents=[parent], help="create, list, describe, delete "
                              "topics (kafka-topics.sh)")
    actions = p.add_mutually_exclusive_group()
    for action in ACTIONS:
        actions.add_argument(f"--{action}", action="store_true")
    p.add_argument("--topic", help="the topic (a regular expression except with --create)")
    p.add_argument("--partitions", type=int, help="partition count (default: the broker's)")
    p.add_argument("--replication-factor", type=int,
                   help="replicas per partition (default: the broker's)")
    p.add_argument("--replica-assignment", metavar="B:B,B:B",
                   help="with --create: the brokers of each partition, partitions separated "
                        "by ',' and replicas by ':' (the first is the preferred leader)")
    p.add_argument("--config", action="append", metavar="KEY=VALUE",
                   help="a topic config override; repeat for more")
    p.add_argument("--if-not-exists", action="store_true",
                   help="with --create: do nothing when the topic exists")
    p.add_argument("--if-exists", action="store_true",
                   help="with --describe/--delete: do nothing when no topic matches")
    p.add_argument("--exclude-internal", action="store_true", help="leave out __ topics")
    p.add_argument("--under-replicated-partitions", action="store_true",
                   help="with --describe: only partitions whose ISR is short of the replicas")
    p.add_argument("--unavailable-partitions", action="store_true",
                   help="with --describe: only partitions with no live leader")
    add_command_config(p, clients="admin")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Check the flags as kafka-topics does, then run the one action."""
    action = next((a for a in ACTIONS if getattr(args, a)), None)
    if action is None:
        raise CliError("Command must include exactly one action: --list, --describe, --create, "
                       "--alter or --delete")
    if action == "alter":
        return alter(args)
    if action != "create":
        for flag in ("partitions", "replication_factor", "config", "replica_assignment"):
            if getattr(args, flag) is not None:
                raise CliError(f"Option --{flag.replace('_', '-')} can only be used with --create")
    if action in ("create", "delete") and not args.topic:
        raise CliError(f"--topic is required with --{action}")
    with AdminClient(args.bootstrap_server, **admin_settings(args)) as admin:
        if action == "create":
            create(admin, args)
        elif action == "list":
            for name in matching(admin.list_topics(include_internal=not args.exclude_internal),
                                 args.topic):
                print(name)
        elif action == "describe":
            describe(admin, args)
        else:
            delete(admin, args)
    return 0


def alter(args: argparse.Namespace) -> int:
    """--alter --partitions N, with kafka-topics' warning about keyed data."""
    if not args.topic:
        raise CliError("--topic is required with --alter")
    if args.partitions is None:
        raise CliError("--alter needs --partitions (topic configs: deltabus configs --alter)")
    for flag in ("replication_factor", "config", "replica_assignment"):
        if getattr(args, flag) is not None:
            raise CliError(f"Option --{flag.replace('_', '-')} can only be used with --create")
    with AdminClient(args.bootstrap_server, **admin_settings(args)) as admin:
        names = matching(admin.list_topics(), args.topic)
        if not names:
            if args.if_exists:
                return 0
            raise CliError(f"Topic '{args.topic}' does not exist as expected")
        print("WARNING: If partitions are increased for a topic that has a key, the partition "
              "logic or ordering of the messages will be affected")
        admin.create_partitions({name: args.partitions for name in names})
    print("Adding partitions succeeded!")
    return 0


def create(admin: AdminClient, args: argparse.Namespace) -> None:
    """Create one topic; a name that collides with another after '.'/'_' folding is refused,
    as Kafka refuses it (their metric names would be the same)."""
    name = args.topic
    validate_topic_name(name)
    for flag, value in (("partitions", args.partitions),
                        ("replication factor", args.replication_factor)):
        if value is not None and value < 1:
            raise CliError(f"The {flag} must be greater than 0")
    configs = parse_properties(args.config, "--config")
    assignment = None
    if args.replica_assignment is not None:
        if args.partitions is not None or args.replication_factor is not None:
            raise CliError("Option --replica-assignment can't be used with --partitions or "
                           "--replication-factor")
        assignment = parse_replica_assignment(args.replica_assignment)
    if has_collision_chars(name):
        warn("Due to limitations in metric names, topics with a period ('.') or underscore ('_') "
             "could collide. To avoid issues it is best to use either, but not both.")
        folded = _fold(name)
        clashes = [t for t in admin.list_topics(include_internal=True)
                   if t != name and _fold(t) == folded]
        if clashes:
            raise errors.InvalidTopicError(
                f"Topic '{name}' collides with existing topics: {', '.join(clashes)}")
    topic = NewTopic(name, args.partitions or -1, args.replication_factor or -1, configs or None,
                     assignment)
    try:
        admin.create_topics([topic])
    except errors.TopicAlreadyExistsError:
        if args.if_not_exists:
            return
        raise
    print(f"Created topic {name}.")


def parse_replica_assignment(text: str) -> dict[int, list[int]]:
    """Kafka's --replica-assignment: "1:2,2:0" is partition 0 on brokers 1 and 2, partition 1 on
    2 and 0."""
    out: dict[int, list[int]] = {}
    for partition, part in enumerate(text.split(",")):
        try:
            brokers = [int(b) for b in part.split(":")]
        except ValueError:
            raise CliError(f"Invalid --replica-assignment '{text}': expected broker ids like "
                           "1:2,2:0") from None
        if len(set(brokers)) != len(brokers):
            raise CliError(f"Partition replica lists may not contain duplicate entries: "
                           f"{part}")
        out[partition] = brokers
    return out


def _fold(name: str) -> str:
    return name.replace(".", "_")


def describe(admin: AdminClient, args: argparse.Namespace) -> None:
    names = matching(admin.list_topics(include_internal=not args.exclude_internal), args.topic)
    if args.topic and not names:
        if args.if_exists:
            return
        raise CliError(f"Topic '{args.topic}' does not exist as expected")
    if not names:
        return
    only_partitions = args.under_replicated_partitions or args.unavailable_partitions
    for state in admin.describe_topics(names):
        partitions = [p for p in state.partitions if _wanted(p, args)]
        if not only_partitions:
            print(format_topic(state))
        for p in partitions:
            print(format_partition(state.name, p))


def _wanted(p: PartitionState, args: argparse.Namespace) -> bool:
    if args.under_replicated_partitions and len(p.isr) >= len(p.replicas):
        return False
    return not (args.unavailable_partitions and p.leader != NO_LEADER)


def delete(admin: AdminClient, args: argparse.Namespace) -> None:
    names = matching(admin.list_topics(include_internal=True), args.topic)
    if not names:
        if args.if_exists:
            return
        raise CliError(f"Topic '{args.topic}' does not exist as expected")
    admin.delete_topics(names)


def matching(names: Iterable[str], pattern: str | None) -> list[str]:
    """Topics `pattern` names: all when None, the literal name when it exists, else those the
    regular expression matches in full (Kafka's rule; an invalid regex matches only itself)."""
    names = sorted(names)
    if pattern is None:
        return names
    if pattern in names:
        return [pattern]
    try:
        regex = re.compile(pattern)
    except re.error:
        return []
    return [n for n in names if regex.fullmatch(n)]


def format_topic(state: TopicState) -> str:
    """Kafka 3.x's topic line of --describe."""
    configs = ",".join(f"{k}={v}" for k, v in sorted(state.configs.items()))
    return (f"Topic: {state.name}\tTopicId: {state.topic_id}\t"
            f"PartitionCount: {len(state.partitions)}\t"
            f"ReplicationFactor: {state.replication_factor}\tConfigs: {configs}")


def format_partition(topic: str, p: PartitionState) -> str:
    """Kafka 3.x's partition line of --describe (leader `none` when no broker leads it)."""
    leader = "none" if p.leader == NO_LEADER else str(p.leader)
    return (f"\tTopic: {topic}\tPartition: {p.partition}\tLeader: {leader}\t"
            f"Replicas: {_ids(p.replicas)}\tIsr: {_ids(p.isr)}")


def _ids(ids: Iterable[int]) -> str:
    return ",".join(str(i) for i in ids)
