"""What every deltabus command shares: the bootstrap default, `key=value` properties, and the
mapping of Kafka's dotted client configs (`linger.ms`) to the clients' keyword arguments.

Users bring habits (and scripts) from Kafka's tools, so flags and property names are Kafka's; a
property the clients do not know is warned about and ignored, as Kafka's clients do, while a value
that does not parse is an error, as Kafka's ConfigException is.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any

DEFAULT_BOOTSTRAP = "127.0.0.1:9192"

# Kafka's producer config name -> (Producer keyword, parser).
PRODUCER_CONFIGS: dict[str, tuple[str, Any]] = {
    "acks": ("acks", str),
    "linger.ms": ("linger_ms", int),
    "batch.size": ("batch_size", int),
    "buffer.memory": ("buffer_memory", int),
    "max.request.size": ("max_request_size", int),
    "max.in.flight.requests.per.connection": ("max_in_flight_requests_per_connection", int),
    "delivery.timeout.ms": ("delivery_timeout_ms", int),
    "request.timeout.ms": ("request_timeout_ms", int),
    "max.block.ms": ("max_block_ms", int),
    "retry.backoff.ms": ("retry_backoff_ms", int),
    "client.id": ("client_id", str),
}

# Kafka's consumer config name -> (Consumer keyword, parser).
CONSUMER_CONFIGS: dict[str, tuple[str, Any]] = {
    "fetch.max.wait.ms": ("fetch_max_wait_ms", int),
    "fetch.min.bytes": ("fetch_min_bytes", int),
    "fetch.max.bytes": ("fetch_max_bytes", int),
    "max.partition.fetch.bytes": ("max_partition_fetch_bytes", int),
    "max.poll.records": ("max_poll_records", int),
    "request.timeout.ms": ("request_timeout_ms", int),
    "retry.backoff.ms": ("retry_backoff_ms", int),
    "client.id": ("client_id", str),
    "group.id": ("group_id", str),
    "auto.offset.reset": ("auto_offset_reset", str),
    "enable.auto.commit": ("enable_auto_commit", lambda v: v.strip().lower() == "true"),
    "auto.commit.interval.ms": ("auto_commit_interval_ms", int),
    "session.timeout.ms": ("session_timeout_ms", int),
    "heartbeat.interval.ms": ("heartbeat_interval_ms", int),
    "max.poll.interval.ms": ("max_poll_interval_ms", int),
    "partition.assignment.strategy": (
        "partition_assignment_strategy", lambda v: [s.strip() for s in v.split(",")]),
}


class CliError(Exception):
    """Bad input the CLI itself detected; `main` prints `Error: <message>` and exits 1."""


def default_bootstrap() -> str:
    """DELTABUS_BOOTSTRAP_SERVER, else the port `deltabus cluster start` binds by default."""
    return os.environ.get("DELTABUS_BOOTSTRAP_SERVER") or DEFAULT_BOOTSTRAP


def split_host_port(address: str) -> tuple[str, int]:
    """`host:port` -> (host, port); a CliError names the bad address."""
    host, _, port = address.strip().rpartition(":")
    if not host or not port.isdigit():
        raise CliError(f"Invalid bootstrap server '{address}': expected host:port")
    return host, int(port)


def parse_properties(items: Iterable[str] | None, flag: str) -> dict[str, str]:
    """`["k=v", ...]` -> `{k: v}`; later ones win, as repeated Kafka properties do."""
    out: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CliError(f"Invalid {flag} '{item}': expected key=value")
        out[key.strip()] = value.strip()
    return out


def client_kwargs(props: dict[str, str], known: dict[str, tuple[str, Any]],
                  *, ignore: Iterable[str] = ()) -> dict[str, Any]:
    """Map Kafka client configs to keyword arguments; warn on unknown names (Kafka's habit)."""
    out: dict[str, Any] = {}
    for key, raw in props.items():
        if key in ignore:
            continue
        if key not in known:
            warn(f"The configuration '{key}' was supplied but isn't a known config.")
            continue
        name, parse = known[key]
        try:
            out[name] = parse(raw)
        except ValueError:
            raise CliError(f"Invalid value {raw} for configuration {key}: "
                           "Not a number of type INT") from None
    return out


def parse_bool(props: dict[str, str], key: str, default: bool = False) -> bool:
    """A Kafka boolean property: `true` (any case) is true, anything else false."""
    raw = props.get(key)
    return default if raw is None else raw.strip().lower() == "true"


def warn_unknown(props: dict[str, str], known: Iterable[str]) -> None:
    """Name properties nobody reads: a typo such as `print.keys` would otherwise pass silently."""
    for key in sorted(set(props) - set(known)):
        warn(f"unknown property '{key}' ignored")


def warn(message: str) -> None:
    print(f"WARNING: {message}", file=sys.stderr)
