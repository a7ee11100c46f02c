"""`deltabus leader-election`: Kafka's kafka-leader-election.sh over AdminClient.elect_leaders.

Same flags (`--election-type`, `--topic`, `--partition`, `--all-topic-partitions`) and the same
three kinds of lines Kafka prints: partitions elected, partitions whose leader was already the
right one, and one line per partition that failed (then the command exits 1).
"""

from __future__ import annotations

import argparse

from deltabus import errors
from deltabus.cli.options import CliError, add_command_config, admin_settings
from deltabus.client.admin import AdminClient


def add_parser(subparsers: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser("leader-election", parents=[parent],
                              help="preferred or unclean leader election "
                                   "(kafka-leader-election.sh)")
    p.add_argument("--election-type", required=True, type=str.upper,
                   choices=["PREFERRED", "UNCLEAN"], help="PREFERRED or UNCLEAN")
    p.add_argument("--topic", help="the topic whose partition to elect (with --partition)")
    p.add_argument("--partition", type=int, help="the partition of --topic")
    p.add_argument("--all-topic-partitions", action="store_true",
                   help="elect every partition of every topic")
    add_command_config(p, "--admin.config", clients="admin")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.all_topic_partitions == (args.topic is not None):
        raise CliError("One and only one of the following options is required: "
                       "--all-topic-partitions, --topic")
    if args.topic is not None and args.partition is None:
        raise CliError("Missing required option(s) [partition]")
    election = args.election_type
    partitions = None if args.all_topic_partitions else [(args.topic, args.partition)]
    with AdminClient(args.bootstrap_server, **admin_settings(args)) as admin:
        results = admin.elect_leaders(election.lower(), partitions)
    elected = [_name(tp) for tp, error in results.items() if error is None]
    not_needed = [_name(tp) for tp, error in results.items()
                  if isinstance(error, errors.ElectionNotNeededError)]
    failed = {tp: error for tp, error in results.items()
              if error is not None and not isinstance(error, errors.ElectionNotNeededError)}
    if elected:
        print(f"Successfully completed leader election ({election}) for partitions "
              f"{', '.join(elected)}")
    if not_needed:
        print(f"Valid replica already elected for partitions {', '.join(not_needed)}")
    for tp, error in failed.items():
        print(f"Error completing leader election ({election}) for partition: {_name(tp)}: "
              f"{error}")
    if failed:
        raise CliError(f"{len(failed)} replica(s) could not be elected")
    return 0


def _name(tp: tuple[str, int]) -> str:
    return f"{tp[0]}-{tp[1]}"
