"""The `deltabus` command: Kafka's command-line tools, with Kafka's flag names, over deltabus.

    deltabus cluster start        kafka-server-start.sh
    deltabus topics               kafka-topics.sh
    deltabus configs              kafka-configs.sh (topic configs, users' SCRAM credentials)
    deltabus acls                 kafka-acls.sh
    deltabus console-producer     kafka-console-producer.sh
    deltabus console-consumer     kafka-console-consumer.sh
    deltabus consumer-groups      kafka-consumer-groups.sh
    deltabus leader-election      kafka-leader-election.sh
    deltabus reassign-partitions  kafka-reassign-partitions.sh
    deltabus delete-records       kafka-delete-records.sh
    deltabus transactions         kafka-transactions.sh (list, describe)
    deltabus schemas              the schema registry (Confluent's operations)
    deltabus perf producer        kafka-producer-perf-test.sh
    deltabus perf consumer        kafka-consumer-perf-test.sh

The project's own benchmark is no command here: it is the `bench` package beside `deltabus`
(`make bench`), a development tool that is not installed.

Every failure a user can cause ends as one line, `Error: <message>`, on stderr, never a traceback:
exit 2 for a command line argparse rejects, 1 for bad input found later or a DeltaBusError. A
traceback means a bug in deltabus.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from deltabus.cli import (
    acl_command,
    cluster_command,
    config_command,
    console_consumer,
    console_producer,
    consumer_groups,
    consumer_performance,
    delete_records,
    leader_election,
    producer_performance,
    reassign_partitions,
    schemas_command,
    share_groups,
    topic_command,
    transactions,
)
from deltabus.cli.options import CliError, default_bootstrap
from deltabus.errors import DeltaBusError, NetworkError

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """argparse rejected the command line."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (argparse prints the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree; defaults read the environment now, so tests can change it."""
    parent = _Parser(add_help=False)
    parent.add_argument("--bootstrap-server", default=default_bootstrap(), metavar="HOST:PORT",
                        help="the cluster to talk to (default: $DELTABUS_BOOTSTRAP_SERVER or "
                             "127.0.0.1:9192)")
    parser = _Parser(prog="deltabus", allow_abbrev=False,
                     description="Kafka-style streaming inside Spark; topics are Delta tables.")
    parser.add_argument("--version", action="version", version=f"deltabus {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    cluster_command.add_parser(commands, parent)
    topic_command.add_parser(commands, parent)
    config_command.add_parser(commands, parent)
    acl_command.add_parser(commands, parent)
    console_producer.add_parser(commands, parent)
    console_consumer.add_parser(commands, parent)
    consumer_groups.add_parser(commands, parent)
    share_groups.add_parser(commands, parent)
    leader_election.add_parser(commands, parent)
    reassign_partitions.add_parser(commands, parent)
    delete_records.add_parser(commands, parent)
    transactions.add_parser(commands, parent)
    schemas_command.add_parser(commands, parent)
    perf = commands.add_parser("perf", help="producer and consumer performance tests")
    perf_commands = perf.add_subparsers(dest="perf_command", metavar="COMMAND", required=True)
    producer_performance.add_parser(perf_commands, parent)
    consumer_performance.add_parser(perf_commands, parent)
    for sub in _all_parsers(parser):
        sub.allow_abbrev = False  # `--partition` must never pass for `--partitions`
    return parser


def _all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out.extend(_all_parsers(sub))
    return out


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("deltabus")
    except PackageNotFoundError:
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (the console script exits with it)."""
    try:
        args = build_parser().parse_args(argv)
    except UsageError as e:
        _error(str(e))
        return EXIT_USAGE
    except SystemExit as e:  # --help and --version
        return e.code if isinstance(e.code, int) else 0
    try:
        return int(args.func(args))
    except BrokenPipeError:  # `deltabus console-consumer ... | head`: the reader left
        _silence_stdout()
        return 0
    except NetworkError as e:
        _error(f"{e} (is a deltabus cluster running at {args.bootstrap_server}?)")
        return EXIT_ERROR
    except (CliError, DeltaBusError, OSError) as e:
        _error(str(e))
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _error(message: str) -> None:
    print(f"Error: {' '.join(message.split())}", file=sys.stderr)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
