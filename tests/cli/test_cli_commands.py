"""Integration: the commands in-process (`main(argv)`) against the session's 3-broker cluster,
and `cluster start` as a real process stopped by Ctrl-C or SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
import uuid
from typing import Any

import pytest
from deltalake import DeltaTable

from deltabus import Producer
from tests.cli.conftest import Cli
from tests.conftest import free_port_block


def test_topic_lifecycle(cli: Cli, topic_name: str) -> None:
    rc, out, _ = cli("topics", "--create", "--topic", topic_name, "--partitions", "3",
                     "--replication-factor", "1", "--config", "retention.ms=60000")
    assert (rc, out) == (0, f"Created topic {topic_name}.\n")
    rc, out, _ = cli("topics", "--list")
    assert rc == 0 and topic_name in out.splitlines()
    rc, out, _ = cli("topics", "--describe", "--topic", topic_name)
    lines = out.splitlines()
    assert rc == 0 and len(lines) == 4
    assert lines[0].startswith(f"Topic: {topic_name}\tTopicId: ")
    assert lines[0].endswith(
        "\tPartitionCount: 3\tReplicationFactor: 1\tConfigs: retention.ms=60000")
    for p, line in enumerate(lines[1:]):
        fields = line.split("\t")
        assert fields[:3] == ["", f"Topic: {topic_name}", f"Partition: {p}"]
        assert [f.split(": ")[0] for f in fields[3:]] == ["Leader", "Replicas", "Isr"]
        assert len(fields[4].split(",")) == 1

    rc, _, err = cli("topics", "--create", "--topic", topic_name)
    assert rc == 1 and "TOPIC_ALREADY_EXISTS" in err
    assert cli("topics", "--create", "--topic", topic_name, "--if-not-exists")[:2] == (0, "")

    assert cli("topics", "--delete", "--topic", topic_name)[:2] == (0, "")
    assert topic_name not in cli("topics", "--list")[1].splitlines()
    rc, _, err = cli("topics", "--describe", "--topic", topic_name)
    assert (rc, err) == (1, f"Error: Topic '{topic_name}' does not exist as expected\n")
    assert cli("topics", "--delete", "--topic", topic_name, "--if-exists")[:2] == (0, "")


def test_replicated_topic_describe_and_leader_election(cli: Cli, cluster: Any,
                                                       topic_name: str) -> None:
    rc, out, _ = cli("topics", "--create", "--topic", topic_name,
                     "--replica-assignment", "1:2:0,2:0:1")
    assert (rc, out) == (0, f"Created topic {topic_name}.\n")
    rc, out, _ = cli("topics", "--describe", "--topic", topic_name)
    lines = out.splitlines()
    assert "\tPartitionCount: 2\tReplicationFactor: 3\t" in lines[0]
    assert lines[1] == (f"\tTopic: {topic_name}\tPartition: 0\tLeader: 1\t"
                        "Replicas: 1,2,0\tIsr: 1,2,0")
    assert lines[2] == (f"\tTopic: {topic_name}\tPartition: 1\tLeader: 2\t"
                        "Replicas: 2,0,1\tIsr: 2,0,1")
    rc, out, _ = cli("topics", "--describe", "--topic", topic_name,
                     "--under-replicated-partitions")
    assert (rc, out) == (0, "")  # every replica in sync
    rc, out, _ = cli("leader-election", "--election-type", "preferred", "--topic", topic_name,
                     "--partition", "0")
    assert (rc, out) == (0, f"Valid replica already elected for partitions {topic_name}-0\n")
    rc, _, err = cli("leader-election", "--election-type", "PREFERRED")
    assert rc == 1 and "--all-topic-partitions, --topic" in err
    rc, _, err = cli("topics", "--create", "--topic", topic_name + "-x",
                     "--replica-assignment", "0:0")
    assert rc == 1 and "duplicate" in err


def test_create_defaults_and_collision_warning(cli: Cli, topic_name: str) -> None:
    dotted = topic_name + ".x"
    rc, out, err = cli("topics", "--create", "--topic", dotted)
    assert rc == 0 and out == f"Created topic {dotted}.\n"
    assert "topics with a period ('.') or underscore ('_') could collide" in err
    rc, out, _ = cli("topics", "--describe", "--topic", dotted)
    assert "\tPartitionCount: 1\tReplicationFactor: 1\t" in out  # the broker defaults
    rc, _, err = cli("topics", "--create", "--topic", topic_name + "_x")
    assert rc == 1 and f"collides with existing topics: {dotted}" in err
    cli("topics", "--delete", "--topic", dotted)


def test_console_producer_then_consumer(cli: Cli, topic_name: str) -> None:
    cli("topics", "--create", "--topic", topic_name, "--partitions", "3")
    rc, out, err = cli("console-producer", "--topic", topic_name, "--property", "parse.key=true",
                       "--property", "key.separator=:", "--producer-property", "acks=all",
                       stdin="k1:v1\nk2:v2\nk3:v3\n")
    assert (rc, out, err) == (0, "", "")
    rc, out, err = cli("console-consumer", "--topic", topic_name, "--from-beginning",
                       "--max-messages", "3", "--property", "print.key=true",
                       "--property", "key.separator=:")
    assert rc == 0
    assert sorted(out.splitlines()) == ["k1:v1", "k2:v2", "k3:v3"]
    assert err.strip().endswith("Processed a total of 3 messages")

    rc, out, err = cli("console-consumer", "--topic", topic_name, "--from-beginning",
                       "--timeout-ms", "1500", "--property", "print.partition=true",
                       "--property", "print.offset=true", "--property", "print.timestamp=true")
    assert rc == 0 and len(out.splitlines()) == 3
    for line in out.splitlines():
        assert re.fullmatch(r"CreateTime:\d+\tPartition:[0-2]\tOffset:0\tv[1-3]", line), line
    assert "Processed a total of 3 messages" in err


def test_console_consumer_starts_at_the_end_or_an_offset(cli: Cli, topic_name: str) -> None:
    cli("topics", "--create", "--topic", topic_name, "--partitions", "1")
    cli("console-producer", "--topic", topic_name, stdin="a\nb\nc\n")
    rc, out, err = cli("console-consumer", "--topic", topic_name, "--timeout-ms", "1000")
    assert (rc, out) == (0, "") and "Processed a total of 0 messages" in err
    rc, out, _ = cli("console-consumer", "--topic", topic_name, "--partition", "0",
                     "--offset", "1", "--max-messages", "2")
    assert (rc, out) == (0, "b\nc\n")
    rc, out, _ = cli("console-consumer", "--topic", topic_name, "--partition", "0",
                     "--offset", "earliest", "--max-messages", "1")
    assert (rc, out) == (0, "a\n")
    rc, _, err = cli("console-consumer", "--topic", topic_name, "--partition", "7")
    assert rc == 1 and "Partition 7 of topic" in err
    rc, _, err = cli("console-consumer", "--topic", topic_name + "-missing", "--timeout-ms", "1")
    assert rc == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in err


def test_console_producer_stops_at_a_line_without_separator(cli: Cli, topic_name: str) -> None:
    cli("topics", "--create", "--topic", topic_name, "--partitions", "1")
    rc, _, err = cli("console-producer", "--topic", topic_name, "--property", "parse.key=true",
                     stdin="k\tfirst\nno separator here\nk\tnever sent\n")
    assert rc == 1
    assert err == "Error: No key separator found on line number 2: 'no separator here'\n"
    rc, out, _ = cli("console-consumer", "--topic", topic_name, "--from-beginning",
                     "--timeout-ms", "1500")
    assert (rc, out) == (0, "first\n")  # what came before the bad line was flushed


def test_perf_producer_and_consumer(cli: Cli, topic_name: str, tmp_path: Any) -> None:
    cli("topics", "--create", "--topic", topic_name, "--partitions", "2")
    for bulk in ([], ["--bulk", "--batch-records", "700"]):
        path = tmp_path / f"producer{len(bulk)}.json"
        rc, out, _ = cli("perf", "producer", "--topic", topic_name, "--num-records", "3000",
                         "--record-size", "50", "--throughput", "-1", "--producer-props",
                         "acks=1", "linger.ms=5", *bulk, "--json", str(path))
        assert rc == 0
        assert re.search(r"^3000 records sent, [\d.]+ records/sec \([\d.]+ MB/sec\), [\d.]+ ms "
                         r"avg latency, [\d.]+ ms max latency, \d+ ms 50th, \d+ ms 95th, \d+ ms "
                         r"99th, \d+ ms 99\.9th\.$", out, re.MULTILINE), out
        figures = json.loads(path.read_text())
        assert figures["records"] == 3000 and figures["bulk"] == bool(bulk)
        assert figures["records_per_s"] > 0 and figures["errors"] == 0

    for bulk in ([], ["--bulk"]):
        path = tmp_path / f"consumer{len(bulk)}.json"
        rc, out, err = cli("perf", "consumer", "--topic", topic_name, "--messages", "6000",
                           "--timeout", "5000", *bulk, "--json", str(path))
        assert rc == 0 and err == ""
        header, line = out.splitlines()
        assert header.startswith("start.time, end.time, data.consumed.in.MB, MB.sec, ")
        assert line.split(", ")[4] == "6000"
        figures = json.loads(path.read_text())
        assert figures["records"] == 6000 and figures["mb"] == pytest.approx(6000 * 50 / 2**20,
                                                                             rel=1e-3)
    rc, _, err = cli("perf", "consumer", "--topic", topic_name, "--messages", "7000",
                     "--timeout", "500", "--hide-header")
    assert rc == 0 and "Exiting before consuming the expected number of messages" in err


def _cluster_start(*argv: str, env: dict[str, str] | None = None
                   ) -> tuple[subprocess.Popen[str], int]:
    """`deltabus cluster start` of one broker on a free port, in a process of its own (`env`:
    its environment, by default this one's), with `argv` added; the process and the port."""
    port = free_port_block(2)  # the bootstrap's, and broker 0's next to it
    process = subprocess.Popen(
        [sys.executable, "-m", "deltabus.cli.main", "cluster", "start", "--brokers", "1",
         "--master", "local[3]", "--port", str(port), "--schema-registry-port", "0",
         "--metrics-port", "0", "--console-port", "0", *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**(os.environ if env is None else env), "SPARK_LOCAL_IP": "127.0.0.1"})
    return process, port


@pytest.mark.spark  # `cluster start` runs Spark in the process it starts
@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_cluster_start_serves_until_signalled_and_flushes(tmp_path: Any, stop_signal: int) -> None:
    """Ctrl-C or SIGTERM stops cleanly: records sent with acks=0 just before are in the table."""
    process, port = _cluster_start("--root", str(tmp_path / "data"), "--kafka-port", "0")
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert first == (f"deltabus cluster started: bootstrap 127.0.0.1:{port}, 1 brokers, "
                         f"data under {tmp_path / 'data'}\n")
        assert process.stdout.readline().startswith("Kafka clients: bootstrap.servers=127.0.0.1:")
        registry = process.stdout.readline()
        assert registry.startswith("Schema registry: schema.registry.url=http://127.0.0.1:")
        with urllib.request.urlopen(registry.split("=", 1)[1].strip() + "/subjects") as answer:
            assert json.loads(answer.read()) == []  # Confluent's REST API answers there
        discovery = process.stdout.readline()
        assert discovery.startswith("Prometheus service discovery: http://127.0.0.1:")
        with urllib.request.urlopen(discovery.split(": ", 1)[1].strip()) as answer:
            # the driver's metrics and broker 0's, as Prometheus' http_sd_configs reads them
            targets = {g["labels"]["broker"]: g["targets"][0] for g in json.loads(answer.read())}
        assert sorted(targets) == ["-1", "0"]
        with urllib.request.urlopen(f"http://{targets['-1']}/metrics") as answer:
            # the registry's GET above, counted and timed by the driver
            assert ('kafka_network_requestmetrics_requests_total{door="schema_registry",'
                    'request="GET"} 1.0') in answer.read().decode()
        console = process.stdout.readline()
        assert console.startswith("Console: http://127.0.0.1:")
        with urllib.request.urlopen(console.split(": ", 1)[1].strip()) as answer:
            assert b"<title>deltabus console</title>" in answer.read()
        assert process.stdout.readline().startswith("Spark UI: http://")
        with Producer(f"127.0.0.1:{port}", acks=0) as producer:
            for i in range(200):
                producer.send("flushed", f"{i}".encode(), partition=0)
        process.send_signal(stop_signal)
        rest, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0
    assert rest.splitlines()[-1] == "deltabus cluster stopped"
    assert "Traceback" not in err
    table = DeltaTable(str(tmp_path / "data" / "topics" / "flushed" / "0" / "replica-0"))
    assert sorted(table.to_pyarrow_table().column("offset").to_pylist()) == list(range(200))


@pytest.mark.spark  # `cluster start` runs Spark in the process it starts
def test_cluster_start_on_s3_takes_its_options_from_a_file_and_never_prints_them(
        tmp_path: Any, s3: Any) -> None:
    """The root on S3 (moto's server), its options in a properties file only: no AWS
    variable in the environment, and the secret in nothing the command prints."""
    root = f"{s3.create_bucket(f'cli-{uuid.uuid4().hex[:8]}')}/deltabus"
    options = tmp_path / "s3.properties"
    options.write_text("".join(f"{k}={v}\n" for k, v in s3.options().items()))
    process, port = _cluster_start(
        "--root", root, "--storage-options-file", str(options), "--kafka-port", "-1",
        env={k: v for k, v in os.environ.items() if not k.startswith("AWS_")})
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert first == (f"deltabus cluster started: bootstrap 127.0.0.1:{port}, 1 brokers, "
                         f"data under {root}\n")
        with Producer(f"127.0.0.1:{port}", acks=1) as producer:
            for i in range(50):
                producer.send("on-s3", f"{i}".encode(), partition=0)
        process.send_signal(signal.SIGINT)
        rest, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert s3.secret_key not in first + rest + err
    table = DeltaTable(f"{root}/topics/on-s3/0/replica-0", storage_options=s3.options())
    assert sorted(table.to_pyarrow_table().column("offset").to_pylist()) == list(range(50))


def test_console_producer_to_a_compacted_topic_needs_keys(cli: Cli, topic_name: str) -> None:
    cli("topics", "--create", "--topic", topic_name, "--config", "cleanup.policy=compact")
    rc, out, err = cli("console-producer", "--topic", topic_name, stdin="no key\n")
    assert rc == 1 and err.count("\n") == 1
    assert ("INVALID_RECORD: Compacted topic cannot accept message without key in topic "
            f"partition {topic_name}-0.") in err
    rc, _, err = cli("console-producer", "--topic", topic_name, "--property", "parse.key=true",
                     "--property", "key.separator=:", stdin="k:v\n")
    assert (rc, err) == (0, "")
