"""`deltabus perf consumer`: Kafka's kafka-consumer-perf-test.sh, plus `--bulk` for poll_batch.

It reads from the beginning of every partition of the topic until `--messages` records arrived, or
`--timeout` ms passed with none (Kafka's rule), and prints Kafka's columns. There is no group to
join yet: `rebalance.time.ms` is the time spent assigning partitions and finding their beginning,
the part Kafka also leaves out of `fetch.time.ms`.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from typing import Any

import pyarrow.compute as pc

from deltabus.cli.options import (
    CONSUMER_CONFIGS,
    CliError,
    add_command_config,
    client_kwargs,
    command_config,
    parse_properties,
)
from deltabus.cli.results import write_json
from deltabus.client.consumer import Consumer, TopicPartition

HEADER = ("start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, "
          "rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec")
POLL_MS_MAX = 1000


def add_parser(subparsers: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser("consumer", parents=[parent],
                              help="consumer throughput (kafka-consumer-perf-test)")
    p.add_argument("--topic", required=True)
    p.add_argument("--messages", type=int, required=True, help="records to consume")
    p.add_argument("--timeout", type=int, default=10_000,
                   help="ms allowed between returned records (default 10000)")
    p.add_argument("--fetch-size", type=int, default=1024 * 1024,
                   help="max.partition.fetch.bytes (default 1048576)")
    p.add_argument("--consumer-props", nargs="+", metavar="KEY=VALUE",
                   help="consumer configs: fetch.max.bytes=... max.poll.records=...")
    p.add_argument("--hide-header", action="store_true", help="print only the figures")
    p.add_argument("--bulk", action="store_true", help="read Arrow tables with poll_batch")
    p.add_argument("--json", metavar="FILE", help="also write the figures to FILE as JSON")
    add_command_config(p, "--consumer.config", clients="consumer")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.messages < 1:
        raise CliError("--messages must be at least 1")
    props = {**command_config(args), **parse_properties(args.consumer_props, "--consumer-props")}
    kwargs = {"max_partition_fetch_bytes": args.fetch_size,
              **client_kwargs(props, CONSUMER_CONFIGS, ignore=("bootstrap.servers",))}
    bootstrap = props.get("bootstrap.servers") or args.bootstrap_server
    start_wall = time.time()
    start = time.monotonic()
    with Consumer(bootstrap, auto_offset_reset="earliest", **kwargs) as consumer:
        tps = [TopicPartition(args.topic, p)
               for p in sorted(consumer.partitions_for_topic(args.topic))]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        fetch_start = time.monotonic()
        count, nbytes = consume(consumer, args.messages, args.timeout, args.bulk)
    end = time.monotonic()
    if count < args.messages:
        print(f"WARNING: Exiting before consuming the expected number of messages: timeout "
              f"({args.timeout} ms) exceeded. You can use the --timeout option to increase the "
              "timeout.", file=sys.stderr)
    figures = figures_for(count, nbytes, start, fetch_start, end)
    if not args.hide_header:
        print(HEADER)
    print(stats_line(figures, start_wall, start_wall + (end - start)))
    figures.update(tool="consumer-perf", topic=args.topic, bulk=args.bulk)
    if args.json:
        write_json(args.json, figures)
    return 0


def consume(consumer: Consumer, messages: int, timeout_ms: int, bulk: bool) -> tuple[int, int]:
    """Poll until `messages` records, or `timeout_ms` with none; returns (records, bytes)."""
    count = nbytes = 0
    last_record = time.monotonic()
    while count < messages:
        left_ms = timeout_ms - (time.monotonic() - last_record) * 1000
        if left_ms <= 0:
            break
        wait_ms = int(min(left_ms, POLL_MS_MAX))
        if bulk:
            tables = consumer.poll_batch(timeout_ms=wait_ms, max_records=messages - count)
            got = sum(t.num_rows for t in tables.values())
            nbytes += sum(_table_bytes(t) for t in tables.values())
        else:
            records = consumer.poll(timeout_ms=wait_ms, max_records=messages - count)
            got = len(records)
            nbytes += sum(len(r.value or b"") + len(r.key or b"") for r in records)
        if got:
            count += got
            last_record = time.monotonic()
    return count, nbytes


def _table_bytes(table: Any) -> int:
    total = 0
    for name in ("key", "value"):
        total += pc.sum(pc.binary_length(table.column(name))).as_py() or 0
    return total


def figures_for(count: int, nbytes: int, start: float, fetch_start: float,
                end: float) -> dict[str, Any]:
    """Kafka's figures from the counts and the three instants (monotonic seconds)."""
    mb = nbytes / 1024 / 1024
    elapsed_s = max(end - start, 1e-9)
    fetch_s = max(end - fetch_start, 1e-9)
    return {
        "records": count, "mb": mb, "elapsed_s": elapsed_s,
        "mb_per_s": mb / elapsed_s, "records_per_s": count / elapsed_s,
        "rebalance_time_ms": int((fetch_start - start) * 1000),
        "fetch_time_ms": int(fetch_s * 1000),
        "fetch_mb_per_s": mb / fetch_s, "fetch_records_per_s": count / fetch_s,
    }


def stats_line(f: dict[str, Any], start_wall: float, end_wall: float) -> str:
    """Kafka's figures line, in the order of HEADER."""
    return (f"{_date(start_wall)}, {_date(end_wall)}, {f['mb']:.4f}, {f['mb_per_s']:.4f}, "
            f"{f['records']}, {f['records_per_s']:.4f}, {f['rebalance_time_ms']}, "
            f"{f['fetch_time_ms']}, {f['fetch_mb_per_s']:.4f}, {f['fetch_records_per_s']:.4f}")


def _date(epoch_s: float) -> str:
    """Kafka's default date format, yyyy-MM-dd HH:mm:ss:SSS."""
    moment = datetime.fromtimestamp(epoch_s)
    return moment.strftime("%Y-%m-%d %H:%M:%S:") + f"{moment.microsecond // 1000:03d}"
