"""What every deltabus command shares: the bootstrap default, `key=value` properties, client
config files (`--command-config`), and the mapping of Kafka's dotted client configs
(`linger.ms`, `security.protocol`) to the clients' keyword arguments.

Users bring habits (and scripts) from Kafka's tools, so flags and property names are Kafka's; a
property the clients do not know is warned about and ignored, as Kafka's clients do, while a value
that does not parse is an error, as Kafka's ConfigException is. Security settings are the same in
every tool: a `--command-config` file (Kafka's flag; the console and perf tools also take their
older `--producer.config` / `--consumer.config`) with `security.protocol`, `sasl.mechanism`,
`sasl.jaas.config` or `sasl.username`/`sasl.password`, and PEM files as `ssl.ca.location`,
`ssl.certificate.location`, `ssl.key.location` (Java's key stores are refused by name).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterable
from typing import Any

from deltabus.client.security import SECURITY_PROPERTIES, refuse_java_stores

DEFAULT_BOOTSTRAP = "127.0.0.1:9192"
PROPERTIES_FILE_BYTES_MAX = 1024 * 1024  # a client config is a few lines

# Kafka's security config name -> (keyword of every client, parser).
SECURITY_CONFIGS: dict[str, tuple[str, Any]] = {
    name: (keyword, str) for name, keyword in SECURITY_PROPERTIES.items()}

# Kafka's admin client config name -> (AdminClient keyword, parser): what --command-config holds.
ADMIN_CONFIGS: dict[str, tuple[str, Any]] = {
    "request.timeout.ms": ("request_timeout_ms", int),
    "client.id": ("client_id", str),
    **SECURITY_CONFIGS,
}

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
    **SECURITY_CONFIGS,
}

# Kafka's consumer config name -> (Consumer keyword, parser).
CONSUMER_CONFIGS: dict[str, tuple[str, Any]] = {
    "fetch.max.wait.ms": ("fetch_max_wait_ms", int),
    "fetch.min.bytes": ("fetch_min_bytes", int),
    "fetch.max.bytes": ("fetch_max_bytes", int),
    "max.partition.fetch.bytes": ("max_partition_fetch_bytes", int),
    "max.poll.records": ("max_poll_records", int),
    "request.timeout.ms": ("request_timeout_ms", int),
    "default.api.timeout.ms": ("default_api_timeout_ms", int),
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
    **SECURITY_CONFIGS,
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
    """Map Kafka client configs to keyword arguments; warn on unknown names (Kafka's habit).
    Java's key and trust stores are an InvalidConfigError naming the PEM setting instead."""
    refuse_java_stores(props)
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


def add_command_config(parser: argparse.ArgumentParser, *aliases: str, clients: str) -> None:
    """`--command-config FILE` (and Kafka's older names for it in this tool)."""
    parser.add_argument("--command-config", *aliases, dest="command_config", metavar="FILE",
                        help=f"a properties file of {clients} configs, e.g. security.protocol="
                             "SASL_SSL, sasl.mechanism, sasl.jaas.config, ssl.ca.location (PEM)")


def command_config(args: argparse.Namespace) -> dict[str, str]:
    """The properties of the tool's `--command-config` file ({} without one)."""
    path = getattr(args, "command_config", None)
    return read_properties(path, "--command-config") if path else {}


def admin_settings(args: argparse.Namespace) -> dict[str, Any]:
    """AdminClient keyword arguments from `--command-config` (read and warned about once)."""
    cached = getattr(args, "_admin_settings", None)
    if cached is None:
        cached = client_kwargs(command_config(args), ADMIN_CONFIGS, ignore=("bootstrap.servers",))
        args._admin_settings = cached
    return dict(cached)


def read_properties(path: str, flag: str) -> dict[str, str]:
    """A Java properties file (Kafka's client config files), read as UTF-8."""
    try:
        with open(path, "rb") as f:
            data = f.read(PROPERTIES_FILE_BYTES_MAX + 1)
    except OSError as e:
        raise CliError(f"Cannot read {flag} file {path}: {e.strerror or e}") from None
    if len(data) > PROPERTIES_FILE_BYTES_MAX:
        raise CliError(f"{flag} file {path} is more than {PROPERTIES_FILE_BYTES_MAX} bytes")
    return parse_properties_text(data.decode("utf-8", "replace"))


_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|.)", re.DOTALL)
_ESCAPED = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_KEY_END = re.compile(r"(?<!\\)(?:\\\\)*[=:\s]")


def parse_properties_text(text: str) -> dict[str, str]:
    """java.util.Properties.load's format: `key=value`, `key: value` or `key value`; `#` and
    `!` comment lines; a line ending in an odd number of backslashes goes on (the next line's
    leading blanks dropped), as a long sasl.jaas.config often does; `\\uXXXX` and `\\t`-style
    escapes. Later keys win."""
    out: dict[str, str] = {}
    pending: str | None = None
    for raw in text.splitlines():
        line = raw.lstrip(" \t\f")
        if pending is None and (not line or line[0] in "#!"):
            continue
        backslashes = len(line) - len(line.rstrip("\\"))
        if backslashes % 2:
            pending = (pending or "") + line[:-1]
            continue
        _add_property(out, (pending or "") + line)
        pending = None
    if pending is not None:
        _add_property(out, pending)
    return out


def _add_property(out: dict[str, str], line: str) -> None:
    match = _KEY_END.search(line)
    if match is None:
        key, rest = line, ""
    else:
        key, rest = line[:match.end() - 1], line[match.end() - 1:]
        rest = rest.lstrip(" \t\f")
        if rest[:1] in ("=", ":"):
            rest = rest[1:].lstrip(" \t\f")
    out[_unescape(key)] = _unescape(rest)


def _unescape(text: str) -> str:
    def one(match: re.Match[str]) -> str:
        code = match.group(1)
        return chr(int(code[1:], 16)) if len(code) == 5 else _ESCAPED.get(code, code)
    return _ESCAPE.sub(one, text)


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
