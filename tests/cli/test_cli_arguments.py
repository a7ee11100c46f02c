"""Fast tests, no cluster: argument parsing and the one-line errors users see."""

from __future__ import annotations

import socket

import pytest

from deltabus.cli import options
from deltabus.cli.console_producer import LineReader
from deltabus.cli.main import build_parser, main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("Error: "), err
    return lines[0]


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("argv", [
    ["topics", "--bogus"],
    [],
    ["cluster"],
    ["perf"],
    ["topics", "--list", "--create"],
    ["topics", "--create", "--topic", "t", "--partitions", "three"],
    ["perf", "producer", "--topic", "t"],
    ["perf", "consumer", "--topic", "t"],
    ["console-consumer"],
    ["console-consumer", "--topic", "t", "--partition"],
])
def test_usage_errors_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str],
                                              argv: list[str]) -> None:
    rc, out, err = run(capsys, *argv)
    assert rc == 2
    assert out == ""
    assert "--help" in one_error_line(err)


@pytest.mark.parametrize("argv, message", [
    (["topics"], ("Command must include exactly one action: --list, --describe, --create, "
                  "--alter or --delete")),
    (["topics", "--alter", "--topic", "t"], "--alter needs --partitions"),
    (["topics", "--alter", "--partitions", "3"], "--topic is required with --alter"),
    (["topics", "--create"], "--topic is required with --create"),
    (["topics", "--delete"], "--topic is required with --delete"),
    (["topics", "--describe", "--partitions", "3"],
     "Option --partitions can only be used with --create"),
    (["topics", "--create", "--topic", "t", "--partitions", "0"],
     "The partitions must be greater than 0"),
    (["topics", "--create", "--topic", "t", "--replication-factor", "-2"],
     "The replication factor must be greater than 0"),
    (["topics", "--create", "--topic", "bad name"], "is illegal"),
    (["topics", "--create", "--topic", "t", "--config", "retention.ms"],
     "Invalid --config 'retention.ms': expected key=value"),
    (["console-consumer", "--topic", "t", "--offset", "5"],
     "The partition is required when offset is specified."),
    (["console-consumer", "--topic", "t", "--partition", "0", "--offset", "5",
      "--from-beginning"], "Options from-beginning and offset cannot be specified together."),
    (["console-consumer", "--topic", "t", "--partition", "0", "--offset", "soon"],
     ("The provided offset value 'soon' is incorrect. Valid values are 'earliest', 'latest', "
      "or a non-negative long.")),
    (["console-producer", "--topic", "t", "--producer-property", "linger.ms=soon"],
     "Invalid value soon for configuration linger.ms: Not a number of type INT"),
    (["console-producer", "--topic", "t", "--property", "parse.key"],
     "Invalid --property 'parse.key': expected key=value"),
    (["console-producer", "--topic", "t", "--producer-property", "acks=2"],
     "INVALID_REQUIRED_ACKS"),
    (["perf", "producer", "--topic", "t", "--num-records", "0", "--record-size", "10"],
     "--num-records must be at least 1"),
    (["perf", "consumer", "--topic", "t", "--messages", "0"], "--messages must be at least 1"),
    (["topics", "--list", "--bootstrap-server", "nohost"],
     "bootstrap server 'nohost' is not host:port"),
    (["cluster", "start", "--brokers", "0"], "--brokers must be at least 1, not 0"),
    (["cluster", "start", "--bootstrap-server", "localhost"], "Invalid bootstrap server"),
    (["cluster", "start", "--root", "hdfs://namenode/deltabus"],
     "--root: the cluster root 'hdfs://namenode/deltabus' has an unknown scheme hdfs://"),
    (["cluster", "start", "--storage-option", "AWS_REGION"],
     "Invalid --storage-option 'AWS_REGION': expected key=value"),
    (["cluster", "start", "--storage-options-file", "/nonexistent/s3.properties"],
     "Cannot read --storage-options-file file /nonexistent/s3.properties"),
])
def test_bad_input_is_one_line_and_exits_1(capsys: pytest.CaptureFixture[str],
                                           argv: list[str], message: str) -> None:
    rc, _, err = run(capsys, *argv, *([] if "--bootstrap-server" in argv else
                                        ["--bootstrap-server", f"127.0.0.1:{unused_port()}"]))
    assert rc == 1
    assert message in one_error_line(err)


def test_no_cluster_is_a_network_error_with_a_hint(capsys: pytest.CaptureFixture[str]) -> None:
    address = f"127.0.0.1:{unused_port()}"
    rc, _, err = run(capsys, "topics", "--list", "--bootstrap-server", address)
    assert rc == 1
    line = one_error_line(err)
    assert "NETWORK_EXCEPTION" in line
    assert f"is a deltabus cluster running at {address}?" in line


def test_help_and_version_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--help")
    assert rc == 0 and "console-consumer" in out
    rc, out, _ = run(capsys, "topics", "--help")
    assert rc == 0 and "--replication-factor" in out
    rc, out, _ = run(capsys, "--version")
    assert rc == 0 and out.startswith("deltabus ")


def test_bootstrap_server_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DELTABUS_BOOTSTRAP_SERVER", raising=False)
    assert build_parser().parse_args(["topics", "--list"]).bootstrap_server == "127.0.0.1:9192"
    monkeypatch.setenv("DELTABUS_BOOTSTRAP_SERVER", "10.0.0.1:9300")
    for argv in (["topics", "--list"], ["console-consumer", "--topic", "t"],
                 ["perf", "consumer", "--topic", "t", "--messages", "1"],
                 ["cluster", "start"]):
        assert build_parser().parse_args(argv).bootstrap_server == "10.0.0.1:9300"


def test_no_abbreviations() -> None:
    with pytest.raises(Exception, match="unrecognized arguments: --partition"):
        build_parser().parse_args(["topics", "--create", "--topic", "t", "--partition", "3"])


def test_cluster_start_root_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DELTABUS_ROOT", raising=False)
    assert build_parser().parse_args(["cluster", "start"]).root == "./data"
    monkeypatch.setenv("DELTABUS_ROOT", "/srv/deltabus")
    args = build_parser().parse_args(["cluster", "start", "--brokers", "2", "--port", "9300"])
    assert (args.root, args.brokers, args.port) == ("/srv/deltabus", 2, 9300)


def test_properties_and_client_configs(capsys: pytest.CaptureFixture[str]) -> None:
    props = options.parse_properties(["a=1", "b = x=y ", "a=2"], "--property")
    assert props == {"a": "2", "b": "x=y"}
    kwargs = options.client_kwargs(
        {"acks": "all", "linger.ms": "0", "batch.size": "1024", "linger.m": "5"},
        options.PRODUCER_CONFIGS)
    assert kwargs == {"acks": "all", "linger_ms": 0, "batch_size": 1024}
    assert "'linger.m' was supplied but isn't a known config" in capsys.readouterr().err


def test_line_reader_follows_kafka() -> None:
    assert LineReader({}).parse("a:b", 1) == (None, "a:b")
    reader = LineReader({"parse.key": "true", "key.separator": ":"})
    assert reader.parse("k:v:w", 1) == ("k", "v:w")
    assert reader.parse(":v", 2) == ("", "v")
    with pytest.raises(options.CliError,
                       match="^No key separator found on line number 3: 'novalue'$"):
        reader.parse("novalue", 3)
    tolerant = LineReader({"parse.key": "true", "key.separator": ":", "ignore.error": "true"})
    assert tolerant.parse("novalue", 1) == (None, "novalue")
    assert LineReader({"parse.key": "true"}).parse("k\tv", 1) == ("k", "v")
