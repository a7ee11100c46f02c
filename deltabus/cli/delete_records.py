"""`deltabus delete-records`: Kafka's kafka-delete-records.sh over AdminClient.delete_records.

Same flag (`--offset-json-file`), same file ({"partitions": [{"topic": "t", "partition": 0,
"offset": 3}], "version": 1}; offset -1: the high watermark) and the same lines: "Executing
records delete operation", "Records delete operation completed:", then per partition its low
watermark or its error. As Kafka's command, a partition's error is a line of the report and the
command still exits 0; a file it cannot use is a one-line error (exit 1) and nothing is deleted.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from deltabus.cli.options import CliError, add_command_config, admin_settings
from deltabus.client.admin import AdminClient
from deltabus.client.consumer_coordinator import TopicPartition

EXAMPLE = '{"partitions":[{"topic":"t","partition":0,"offset":3}],"version":1}'


def add_parser(subparsers: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser("delete-records", parents=[parent],
                              help="delete records below an offset (kafka-delete-records.sh)")
    p.add_argument("--offset-json-file", metavar="FILE", required=True,
                   help=f"the partitions and offsets, as {EXAMPLE}")
    add_command_config(p, clients="admin")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    offsets = read_offsets(args.offset_json_file)
    print("Executing records delete operation")
    with AdminClient(args.bootstrap_server, **admin_settings(args)) as admin:
        results = admin.delete_records(offsets)
    print("Records delete operation completed:")
    for tp in offsets:
        result = results[tp]
        if result.error is None:
            print(f"partition: {tp.topic}-{tp.partition}\tlow_watermark: {result.low_watermark}")
        else:
            print(f"partition: {tp.topic}-{tp.partition}\terror: {result.error}")
    return 0


def read_offsets(path: str) -> dict[TopicPartition, int]:
    """The partitions and offsets of an offset JSON file, in its order; CliError names what is
    wrong with it (unreadable, not JSON, not this format, a partition twice)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise CliError(f"cannot read {path}: {e.strerror}") from None
    try:
        plan: Any = json.loads(text)
    except ValueError:
        raise CliError(f"{path}: the input string is not a valid JSON") from None
    try:
        if plan.get("version", 1) != 1:
            raise CliError(f"{path}: not supported version field value {plan['version']}")
        entries = [(TopicPartition(str(p["topic"]), int(p["partition"])), int(p["offset"]))
                   for p in plan["partitions"]]
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise CliError(f"{path} is not an offset JSON file ({EXAMPLE}): missing or bad {e}"
                       ) from None
    offsets = dict(entries)
    if len(offsets) < len(entries):
        twice = sorted({f"{tp.topic}-{tp.partition}" for tp, _ in entries
                        if sum(1 for other, _ in entries if other == tp) > 1})
        raise CliError(f"Offset json file contains duplicate topic partitions: "
                       f"{','.join(twice)}")
    if not offsets:
        raise CliError(f"{path} names no partitions ({EXAMPLE})")
    return offsets
