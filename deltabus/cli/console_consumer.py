"""`deltabus console-consumer`: Kafka's kafka-console-consumer.sh.

With `--group G` it joins the consumer group and starts at the group's committed offsets (where
the group has none: at the end, or the beginning with `--from-beginning`), committing as it goes
and when it exits; run again, it goes on where it stopped. Without a group it assigns every
partition of the topic (or the one `--partition`) and starts at the end, unless
`--from-beginning` or `--offset` says otherwise. Lines are printed as Kafka's
DefaultMessageFormatter prints them, so `print.key`, `print.offset`... give the same columns. It
stops after `--max-messages`, or once `--timeout-ms` passes with no record, and always ends with
`Processed a total of N messages` on stderr, as Kafka does.
"""

from __future__ import annotations

import argparse
import sys
import time

from deltabus import errors
from deltabus.cli.options import (
    CONSUMER_CONFIGS,
    CliError,
    add_command_config,
    client_kwargs,
    command_config,
    parse_bool,
    parse_properties,
    warn_unknown,
)
from deltabus.client.consumer import Consumer, TopicPartition
from deltabus.records import LOG_APPEND_TIME, ConsumerRecord

# A consumer in a group waits this long at most for partitions before --timeout-ms counts.
GROUP_JOIN_WAIT_S_MAX = 30.0
POLL_MS_MAX = 1000  # a poll never blocks longer, so Ctrl-C and timeouts are noticed promptly


def add_parser(subparsers: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser("console-consumer", parents=[parent],
                              help="print records of a topic (kafka-console-consumer.sh)")
    p.add_argument("--topic", required=True)
    p.add_argument("--from-beginning", action="store_true",
                   help="start at the earliest record instead of the end")
    p.add_argument("--group", help="the consumer group to read in (committed offsets win over "
                                   "--from-beginning)")
    p.add_argument("--partition", type=int, help="read only this partition")
    p.add_argument("--offset", help="with --partition: earliest, latest or an offset")
    p.add_argument("--max-messages", type=int, help="stop after this many records")
    p.add_argument("--timeout-ms", type=int, help="stop when no record came for this long")
    p.add_argument("--property", action="append", metavar="KEY=VALUE",
                   help="formatter property: print.key, print.partition, print.offset, "
                        "print.timestamp, print.headers, print.value, key.separator, "
                        "line.separator, null.literal")
    p.add_argument("--consumer-property", action="append", metavar="KEY=VALUE",
                   help="a consumer config (fetch.max.bytes, max.poll.records, ...)")
    add_command_config(p, "--consumer.config", clients="consumer")
    p.set_defaults(func=run)


class MessageFormatter:
    """Kafka's DefaultMessageFormatter: timestamp, partition, offset, headers, key, value, in that
    order, joined by `key.separator`; a missing key or value prints as `null.literal`."""

    PROPERTIES = ("print.timestamp", "print.partition", "print.offset", "print.headers",
                  "print.key", "print.value", "key.separator", "line.separator",
                  "headers.separator", "null.literal")

    def __init__(self, props: dict[str, str] | None = None) -> None:
        props = props or {}
        self.print_timestamp = parse_bool(props, "print.timestamp")
        self.print_partition = parse_bool(props, "print.partition")
        self.print_offset = parse_bool(props, "print.offset")
        self.print_headers = parse_bool(props, "print.headers")
        self.print_key = parse_bool(props, "print.key")
        self.print_value = parse_bool(props, "print.value", default=True)
        self.key_separator = props.get("key.separator", "\t")
        self.line_separator = props.get("line.separator", "\n")
        self.headers_separator = props.get("headers.separator", ",")
        self.null_literal = props.get("null.literal", "null")

    def format(self, record: ConsumerRecord) -> str:
        """One record as Kafka prints it, line separator included."""
        fields = []
        if self.print_timestamp:
            kind = "LogAppendTime" if record.timestamp_type == LOG_APPEND_TIME else "CreateTime"
            fields.append(f"{kind}:{record.timestamp}" if record.timestamp >= 0
                          else "NO_TIMESTAMP")
        if self.print_partition:
            fields.append(f"Partition:{record.partition}")
        if self.print_offset:
            fields.append(f"Offset:{record.offset}")
        if self.print_headers:
            fields.append(self.headers_separator.join(
                f"{k}:{self._text(v)}" for k, v in record.headers) or "NO_HEADERS")
        if self.print_key:
            fields.append(self._text(record.key))
        if self.print_value:
            fields.append(self._text(record.value))
        return self.key_separator.join(fields) + self.line_separator

    def _text(self, data: bytes | None) -> str:
        return self.null_literal if data is None else data.decode("utf-8", "replace")


def run(args: argparse.Namespace) -> int:
    props = parse_properties(args.property, "--property")
    warn_unknown(props, MessageFormatter.PROPERTIES)
    formatter = MessageFormatter(props)
    kwargs = client_kwargs({**command_config(args),
                            **parse_properties(args.consumer_property, "--consumer-property")},
                           CONSUMER_CONFIGS, ignore=("bootstrap.servers",))
    start = _start_position(args)
    if args.group is not None and args.partition is not None:
        raise CliError("Options group and partition cannot be specified together.")
    if args.group is not None:
        kwargs.update(group_id=args.group, auto_offset_reset=(
            "earliest" if args.from_beginning else "latest"))
    consumer = Consumer(args.bootstrap_server, **kwargs)
    count = 0
    try:
        if args.group is not None:
            consumer.subscribe([args.topic])
        else:
            _assign(consumer, args.topic, args.partition, start)
        max_messages = args.max_messages if (args.max_messages or 0) >= 0 else None
        count = _print_records(consumer, formatter, max_messages, args.timeout_ms)
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
        sys.stdout.flush()
    print(f"Processed a total of {count} messages", file=sys.stderr)
    return 0


def _start_position(args: argparse.Namespace) -> str | int:
    """earliest, latest or an offset, with kafka-console-consumer's checks and messages."""
    if args.offset is None:
        return "earliest" if args.from_beginning else "latest"
    if args.partition is None:
        raise CliError("The partition is required when offset is specified.")
    if args.from_beginning:
        raise CliError("Options from-beginning and offset cannot be specified together.")
    if args.offset in ("earliest", "latest"):
        return str(args.offset)
    if args.offset.isdigit():
        return int(args.offset)
    raise CliError(f"The provided offset value '{args.offset}' is incorrect. Valid values are "
                   "'earliest', 'latest', or a non-negative long.")


def _assign(consumer: Consumer, topic: str, partition: int | None, start: str | int) -> None:
    """Assign the partitions and pin where reading starts, before the first poll."""
    partitions = sorted(consumer.partitions_for_topic(topic))
    if partition is not None:
        if partition not in partitions:
            raise errors.UnknownTopicOrPartitionError(
                f"Partition {partition} of topic {topic} does not exist "
                f"(it has {len(partitions)})")
        partitions = [partition]
    tps = [TopicPartition(topic, p) for p in partitions]
    consumer.assign(tps)
    if start == "earliest":
        consumer.seek_to_beginning(*tps)
    elif start == "latest":
        consumer.seek_to_end(*tps)
    else:
        consumer.seek(tps[0], int(start))


def _print_records(consumer: Consumer, formatter: MessageFormatter, max_messages: int | None,
                   timeout_ms: int | None) -> int:
    """Poll and print until max_messages, or timeout_ms with no record once partitions are
    assigned (a new group waits group.initial.rebalance.delay.ms first); returns the count."""
    count = 0
    started = last_record = time.monotonic()
    while max_messages is None or count < max_messages:
        wait_ms = POLL_MS_MAX
        if timeout_ms is not None:
            left_ms = timeout_ms - (time.monotonic() - last_record) * 1000
            if left_ms <= 0:
                break
            wait_ms = int(min(wait_ms, left_ms))
        limit = None if max_messages is None else max_messages - count
        records = consumer.poll(timeout_ms=wait_ms, max_records=limit)
        if not consumer.assignment() and time.monotonic() - started < GROUP_JOIN_WAIT_S_MAX:
            last_record = time.monotonic()  # a group still forming: --timeout-ms counts after
        if records:
            last_record = time.monotonic()
            sys.stdout.write("".join(formatter.format(r) for r in records))
            sys.stdout.flush()
            count += len(records)
    return count
