"""KafkaJS (npm, pinned in tests/kafka/node/package.json), unmodified, against the shared cluster's
Kafka listeners, running the users' notes' producer and consumer (tests/kafka/node/*.js: keyed
messages, a consumer group reading from the beginning): what KafkaJS produces is what deltabus's
own clients read, KafkaJS's group consumer reads what deltabus's producer wrote, and its commits are
the group's offsets in deltabus, where a second run resumes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from deltabus import AdminClient, NewTopic, Producer
from deltabus.client.partitioner import partition_for_key
from tests.conftest import read_records

NODE_DIR = Path(__file__).parent / "node"
PARTITIONS = 3
INSTALL_HINT = ("install Node.js (Debian/Ubuntu: apt-get install -y nodejs npm) and run "
                "`make setup` (it runs `npm ci --prefix tests/kafka/node`)")


def run_node(cluster, script: str, *args: str, timeout_s: float = 45) -> list[dict]:
    """Run one of tests/kafka/node's scripts; its JSON output lines, KafkaJS's own logs left out."""
    done = run_node_at(cluster.kafka_bootstrap_servers, script, *args, timeout_s=timeout_s)
    assert done.returncode == 0, (f"node {script} {' '.join(args)} exited {done.returncode}\n"
                                  f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}")
    return json_lines(done.stdout)


def run_node_at(bootstrap: str, script: str, *args: str, env: dict[str, str] | None = None,
                timeout_s: float = 45) -> subprocess.CompletedProcess[str]:
    """Run one of tests/kafka/node's scripts against `bootstrap`, with `env` added to its
    environment (the security settings security.js reads); it may fail."""
    node = shutil.which("node")
    if node is None:
        pytest.fail(f"`node` is not on PATH, so KafkaJS cannot run: {INSTALL_HINT}")
    if not (NODE_DIR / "node_modules" / "kafkajs" / "package.json").is_file():
        pytest.fail(f"KafkaJS is not installed in {NODE_DIR}/node_modules: {INSTALL_HINT}")
    full_env = dict(os.environ, KAFKA_BROKERS=bootstrap, KAFKAJS_NO_PARTITIONER_WARNING="1",
                    **(env or {}))
    try:
        return subprocess.run([node, script, *args], cwd=NODE_DIR, env=full_env,
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"node {script} {' '.join(args)} timed out after {timeout_s} s\n"
                             f"stdout:\n{e.stdout}\nstderr:\n{e.stderr}") from e


def json_lines(stdout: str) -> list[dict]:
    """A script's JSON output lines, KafkaJS's own log lines left out."""
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("logger") != "kafkajs"]


def create_topic(cluster, topic: str) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, PARTITIONS, 3)])


def records(cluster, topic: str, count: int) -> list[tuple[int, int, str | None, str | None]]:
    """The topic's records as deltabus's Consumer reads them: (partition, offset, key, value)."""
    got = read_records(cluster.bootstrap_servers, topic, PARTITIONS, count)
    return sorted((r.partition, r.offset, r.key and r.key.decode(), r.value and r.value.decode())
                  for r in got)


def committed(cluster, group: str) -> dict[tuple[str, int], int]:
    with AdminClient(cluster.bootstrap_servers) as admin:
        return admin.list_consumer_group_offsets(group)


def test_what_kafkajs_produces_deltabus_reads(cluster, topic_name) -> None:
    create_topic(cluster, topic_name)
    messages = [(f"user{i % 5}", f"hi there {i}") for i in range(30)]
    metadata = run_node(cluster, "producer.js", topic_name, *(f"{k}:{v}" for k, v in messages))

    # KafkaJS's default partitioner is Kafka's: a key goes where deltabus would put it.
    placed: dict[int, list[tuple[str, str]]] = {}
    for key, value in messages:
        placed.setdefault(partition_for_key(key.encode(), PARTITIONS), []).append((key, value))
    assert sorted((m["topicName"], m["partition"], m["errorCode"], m["baseOffset"])
                  for m in metadata) == [(topic_name, p, 0, "0") for p in sorted(placed)]
    expected = sorted((p, offset, key, value) for p, sent in placed.items()
                      for offset, (key, value) in enumerate(sent))
    assert records(cluster, topic_name, len(messages)) == expected


def test_kafkajs_group_reads_what_deltabus_wrote_commits_and_resumes(cluster, topic_name) -> None:
    group = f"{topic_name}-my-app3"
    create_topic(cluster, topic_name)

    def produce(start: int, count: int) -> list[tuple[str, int, int, str, str]]:
        sent = [(f"user{i % 7}", f"paid {i}") for i in range(start, start + count)]
        with Producer(cluster.bootstrap_servers, acks="all") as producer:
            futures = [producer.send(topic_name, v.encode(), key=k.encode()) for k, v in sent]
            producer.flush()
            return sorted((topic_name, (m := f.get(30)).partition, m.offset, k, v)
                          for f, (k, v) in zip(futures, sent, strict=True))

    def consume(count: int) -> list[tuple[str, int, int, str, str]]:
        got = run_node(cluster, "consumer.js", topic_name, group, str(count))
        assert len(got) == count
        return sorted((m["topic"], m["partition"], m["offset"], m["key"], m["value"]) for m in got)

    first = produce(0, 40)
    assert consume(40) == first
    ends = {(topic_name, p): 0 for p in range(PARTITIONS)}
    for _, p, offset, _, _ in first:
        ends[(topic_name, p)] = max(ends[(topic_name, p)], offset + 1)
    assert committed(cluster, group) == {tp: end for tp, end in ends.items() if end}

    second = produce(40, 9)  # a second run of the group reads only what came after its commits
    assert consume(9) == second
    for _, p, offset, _, _ in second:
        ends[(topic_name, p)] = max(ends[(topic_name, p)], offset + 1)
    assert committed(cluster, group) == {tp: end for tp, end in ends.items() if end}


def test_the_notes_example_kafkajs_to_kafkajs(cluster, topic_name) -> None:
    """The notes' index.ts: KafkaJS produces "hi there" (keyed "user1"), a group reads it back."""
    create_topic(cluster, topic_name)
    [meta] = run_node(cluster, "producer.js", topic_name, "user1:hi there")
    partition = partition_for_key(b"user1", PARTITIONS)
    assert (meta["partition"], meta["baseOffset"], meta["errorCode"]) == (partition, "0", 0)
    [message] = run_node(cluster, "consumer.js", topic_name, f"{topic_name}-my-app3", "1")
    assert message == {"topic": topic_name, "partition": partition, "offset": 0, "key": "user1",
                       "value": "hi there"}
    assert committed(cluster, f"{topic_name}-my-app3") == {(topic_name, partition): 1}
