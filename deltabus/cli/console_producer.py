"""`deltabus console-producer`: Kafka's kafka-console-producer.sh, one record per stdin line.

Like Kafka's LineMessageReader: with `parse.key=true` each line is `key<key.separator>value`, and a
line without the separator stops the producer with an error naming the line (unless
`ignore.error=true`, which sends it as a value with no key). Everything read before the end (Ctrl-D,
a bad line or Ctrl-C) is flushed before exit, so nothing typed is silently lost.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from deltabus.cli.options import (
    PRODUCER_CONFIGS,
    CliError,
    add_command_config,
    client_kwargs,
    command_config,
    parse_bool,
    parse_properties,
    warn_unknown,
)
from deltabus.client.producer import FutureRecordMetadata, Producer

READER_PROPERTIES = ("parse.key", "key.separator", "ignore.error")


def add_parser(subparsers: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser("console-producer", parents=[parent],
                              help="send stdin lines as records (kafka-console-producer.sh)")
    p.add_argument("--topic", required=True)
    p.add_argument("--property", action="append", metavar="KEY=VALUE",
                   help="line reader property: parse.key, key.separator, ignore.error")
    p.add_argument("--producer-property", action="append", metavar="KEY=VALUE",
                   help="a producer config (acks, linger.ms, batch.size, ...); repeat for more")
    add_command_config(p, "--producer.config", clients="producer")
    p.set_defaults(func=run)


class LineReader:
    """Turns stdin lines into (key, value) as Kafka's LineMessageReader does."""

    def __init__(self, props: dict[str, str]) -> None:
        self.parse_key = parse_bool(props, "parse.key")
        self.key_separator = props.get("key.separator", "\t")
        self.ignore_error = parse_bool(props, "ignore.error")
        if self.parse_key and not self.key_separator:
            raise CliError("key.separator must not be empty")

    def parse(self, line: str, line_number: int) -> tuple[str | None, str]:
        if not self.parse_key:
            return None, line
        key, sep, value = line.partition(self.key_separator)
        if sep:
            return key, value
        if self.ignore_error:
            return None, line
        raise CliError(f"No key separator found on line number {line_number}: '{line}'")


class _Failures:
    """Counts failed sends from the producer's callback threads and keeps the first error."""

    def __init__(self) -> None:
        self.count = 0
        self.first: BaseException | None = None

    def __call__(self, future: FutureRecordMetadata) -> None:
        error = future.exception(0)
        if error is not None:
            self.count += 1
            self.first = self.first or error


def run(args: argparse.Namespace) -> int:
    props = parse_properties(args.property, "--property")
    warn_unknown(props, READER_PROPERTIES)
    reader = LineReader(props)
    kwargs = client_kwargs({**command_config(args),
                            **parse_properties(args.producer_property, "--producer-property")},
                           PRODUCER_CONFIGS, ignore=("bootstrap.servers",))
    producer = Producer(args.bootstrap_server, **kwargs)
    failures = _Failures()
    try:
        _send_lines(producer, args.topic, reader, failures)
    finally:
        producer.close()
    if failures.count:
        raise CliError(f"{failures.count} records failed to send to {args.topic}: "
                       f"{failures.first}")
    return 0


def _send_lines(producer: Producer, topic: str, reader: LineReader, failures: Any) -> None:
    """Send each stdin line; Ctrl-C ends input like Ctrl-D (the caller flushes)."""
    interactive = sys.stdin.isatty()
    try:
        for number, line in enumerate(_lines(interactive), start=1):
            key, value = reader.parse(line, number)
            future = producer.send(topic, _encode(value), key=_encode(key))
            future.add_done_callback(failures)
    except KeyboardInterrupt:
        pass


def _lines(interactive: bool) -> Any:
    """Stdin lines without their line ending; a `>` prompt when a person is typing, as Kafka."""
    while True:
        if interactive:
            print(">", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            return
        yield line.rstrip("\r\n")


def _encode(text: str | None) -> bytes | None:
    # surrogateescape gives back the exact bytes of input that was not UTF-8
    return None if text is None else text.encode("utf-8", "surrogateescape")
