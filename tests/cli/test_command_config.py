"""Every tool takes Kafka's `--command-config FILE` (the console and perf tools also their older
`--producer.config` / `--consumer.config`, leader-election `--admin.config`): a Java properties
file whose security settings reach every client the tool makes. No Spark: the tools run against a
FakeCluster on TLS listeners that records what each call carried."""

from __future__ import annotations

import argparse
import base64
import pathlib
from collections.abc import Iterator

import pytest
import trustme

from deltabus.cli.main import _all_parsers, build_parser, main
from deltabus.cli.options import parse_properties_text
from deltabus.client.security import AUTHORIZATION_KEY
from tests.client.fake_cluster import FakeCluster
from tests.client.secure_server import CallRecorder, TlsServers

SECRET = "alice-secret"
BASIC = "Basic " + base64.b64encode(f"alice:{SECRET}".encode()).decode()


def run(capsys: pytest.CaptureFixture[str], *argv: str,
        stdin: str | None = None, monkeypatch: pytest.MonkeyPatch | None = None
        ) -> tuple[int, str, str]:
    if stdin is not None and monkeypatch is not None:
        import io
        import sys
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    capsys.readouterr()
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    return lines[0]


# ---- the properties file ------------------------------------------------------------------------

def test_java_properties_as_kafkas_client_configs_are_written() -> None:
    text = "\n".join([
        "# a client config, as Kafka's docs show it",
        "! also a comment",
        "security.protocol=SASL_SSL",
        "sasl.mechanism: SCRAM-SHA-256",
        "ssl.ca.location /etc/deltabus/ca.pem",
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\",
        '    username="alice" \\',
        f'    password="{SECRET}";',
        "   ",
        r"client.id = tab\tand\u00e9 ",
        r"key\=with\:separators=value=with=equals",
        "security.protocol=SSL",
    ])
    assert parse_properties_text(text) == {
        "security.protocol": "SSL",  # later wins
        "sasl.mechanism": "SCRAM-SHA-256",
        "ssl.ca.location": "/etc/deltabus/ca.pem",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                            f'username="alice" password="{SECRET}";',
        "client.id": "tab\tand\u00e9 ",
        "key=with:separators": "value=with=equals",
    }


def test_every_tool_that_talks_to_a_cluster_takes_command_config() -> None:
    tools = {p.prog: p for p in _all_parsers(build_parser())
             if any("--bootstrap-server" in a.option_strings for a in p._actions)}
    assert len(tools) >= 9
    for prog, parser in tools.items():
        if prog.endswith("cluster start"):
            continue  # the broker side: not a client
        options = {s for a in parser._actions for s in a.option_strings}
        assert "--command-config" in options, prog


@pytest.mark.parametrize("argv", [
    ["console-producer", "--topic", "t", "--producer.config", "F"],
    ["console-consumer", "--topic", "t", "--consumer.config", "F"],
    ["perf", "producer", "--topic", "t", "--num-records", "1", "--record-size", "1",
     "--producer.config", "F"],
    ["perf", "consumer", "--topic", "t", "--messages", "1", "--consumer.config", "F"],
    ["leader-election", "--election-type", "preferred", "--all-topic-partitions",
     "--admin.config", "F"],
    ["topics", "--list", "--command-config", "F"],
])
def test_kafkas_older_flag_names_are_the_same_option(argv: list[str]) -> None:
    args: argparse.Namespace = build_parser().parse_args(argv)
    assert args.command_config == "F"


@pytest.fixture
def config_file(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "client.properties"


@pytest.mark.parametrize(("lines", "says"), [
    (["security.protocol=SASL_SSL", "ssl.truststore.location=/etc/kafka/truststore.jks"],
     "ssl.truststore.location is Java's key or trust store setting: deltabus takes PEM files, "
     "give ssl.ca.location"),
    (["security.protocol=TLS"], "security.protocol must be one of"),
    (["security.protocol=SASL_SSL", "sasl.mechanism=GSSAPI", "sasl.username=a",
      f"sasl.password={SECRET}"], "sasl.mechanism must be one of"),
    (["security.protocol=SASL_SSL", "sasl.jaas.config=org.apache.kafka.common.security.scram."
      f'ScramLoginModule required username="alice" password="{SECRET}"'],
     "sasl.jaas.config does not parse"),
    (["security.protocol=SSL", "ssl.ca.location=/no/such/ca.pem"],
     "ssl.ca.location: cannot read /no/such/ca.pem"),
])
def test_a_bad_security_config_is_one_error_line(capsys: pytest.CaptureFixture[str],
                                                 config_file: pathlib.Path, lines: list[str],
                                                 says: str) -> None:
    config_file.write_text("\n".join(lines) + "\n")
    rc, out, err = run(capsys, "topics", "--list", "--bootstrap-server", "127.0.0.1:1",
                       "--command-config", str(config_file))
    assert rc == 1 and out == ""
    line = one_error_line(err)
    assert says in line
    assert SECRET not in line


def test_a_missing_config_file_is_one_error_line(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: pathlib.Path) -> None:
    rc, _, err = run(capsys, "console-producer", "--topic", "t", "--producer.config",
                     str(tmp_path / "nope.properties"))
    assert rc == 1
    assert "Cannot read --command-config file" in one_error_line(err)


# ---- on the wire --------------------------------------------------------------------------------

@pytest.fixture
def secured(tmp_path: pathlib.Path) -> Iterator[tuple[FakeCluster, CallRecorder, pathlib.Path]]:
    """A fake cluster on TLS listeners, and a SASL_SSL client config for it."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    recorder = CallRecorder()
    fake = FakeCluster(brokers=2, serve=TlsServers(ca, recorder).serve)
    config = tmp_path / "client.properties"
    config.write_text("\n".join([
        "security.protocol=SASL_SSL",
        "sasl.mechanism=SCRAM-SHA-512",
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\",
        f'    username="alice" password="{SECRET}";',
        f"ssl.ca.location={tmp_path / 'ca.pem'}",
        "bootstrap.servers=ignored:1",
    ]) + "\n")
    yield fake, recorder, config
    fake.close()


def test_the_tools_talk_sasl_ssl_with_the_command_config(
        secured, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    fake, recorder, config = secured
    common = ["--bootstrap-server", fake.bootstrap_servers]
    rc, out, err = run(capsys, "topics", "--create", "--topic", "payments", "--partitions", "2",
                       "--command-config", str(config), *common)
    assert (rc, err) == (0, ""), err
    rc, _, err = run(capsys, "console-producer", "--topic", "payments", "--producer.config",
                     str(config), "--producer-property", "acks=1", *common,
                     stdin="one\ntwo\n", monkeypatch=monkeypatch)
    assert (rc, err) == (0, ""), err
    rc, out, err = run(capsys, "console-consumer", "--topic", "payments", "--from-beginning",
                       "--group", "readers", "--max-messages", "2", "--consumer.config",
                       str(config), *common)
    assert rc == 0, err
    assert sorted(out.split()) == ["one", "two"]
    rc, out, err = run(capsys, "consumer-groups", "--describe", "--group", "readers",
                       "--command-config", str(config), *common)
    assert rc == 0, err
    assert "readers" in out and "payments" in out
    rc, out, err = run(capsys, "topics", "--list", "--command-config", str(config), *common)
    assert (rc, out.split()) == (0, ["payments"]), err
    rc, out, err = run(capsys, "configs", "--describe", "--entity-type", "users",
                       "--entity-name", "alice", "--command-config", str(config), *common)
    assert rc == 0 and "alice" in out, err  # the fake has no users: Kafka's "Error retrieving"
    calls = recorder.seen()
    assert {"CreateTopics", "Produce", "Fetch", "JoinGroup", "OffsetCommit",
            "DescribeGroups", "Metadata", "DescribeUserScramCredentials"} <= {
        c.method for c in calls}
    assert {c.transport for c in calls} == {b"ssl"}
    assert [c.method for c in calls if c.header(AUTHORIZATION_KEY) != [BASIC]] == []


def test_without_the_command_config_a_tool_says_which_setting_is_missing(
        secured, capsys: pytest.CaptureFixture[str]) -> None:
    fake, recorder, _ = secured
    rc, _, err = run(capsys, "topics", "--list", "--bootstrap-server", fake.bootstrap_servers)
    assert rc == 1
    assert "set security.protocol" in one_error_line(err)
    assert recorder.seen() == []
