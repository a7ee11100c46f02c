"""kcat (Debian's package, on librdkafka), unmodified, against the shared cluster's Kafka listeners:
`-L` lists the brokers and topics deltabus has, `-P -K:` produces keyed lines deltabus's own
consumer reads, `-C -e -o beginning` reads them back and stops at the end, and `-G` consumes in a
group whose commits are deltabus's and where a second run resumes."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from deltabus import AdminClient, NewTopic, Producer
from tests.conftest import read_records

PARTITIONS = 3
FORMAT = "%k:%s:%p:%o\\n"  # key:value:partition:offset


def kcat(cluster, *args: str, stdin: str | None = None, timeout_s: float = 20) -> str:
    """Run kcat against the cluster's Kafka bootstrap; its standard output (it must exit 0)."""
    cmd, returncode, out, err = run_kcat(cluster.kafka_bootstrap_servers, *args, stdin=stdin,
                                         timeout_s=timeout_s)
    assert returncode == 0, (f"{' '.join(cmd)} exited {returncode}\n"
                             f"stdout:\n{out}\nstderr:\n{err[:3000]}")
    return out


def run_kcat(bootstrap: str, *args: str, stdin: str | None = None, timeout_s: float = 20
             ) -> tuple[list[str], int, str, str]:
    """Run kcat against `bootstrap`: (command, exit code, stdout, stderr). One still running
    after `timeout_s` is stopped as Ctrl-C would (SIGTERM, so it flushes) and the test fails."""
    exe = shutil.which("kcat")
    if exe is None:
        pytest.fail("kcat is not installed, so librdkafka's client cannot be tested: install it "
                    "(Debian/Ubuntu: apt-get install -y kcat; `make setup` does when it can)")
    cmd = [exe, "-b", bootstrap, *args]
    with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:
        try:
            out, err = proc.communicate(stdin, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.terminate()
            out, err = proc.communicate(timeout=10)
            raise AssertionError(f"{' '.join(cmd)} still ran after {timeout_s} s\n"
                                 f"stdout:\n{out}\nstderr:\n{err[:3000]}") from None
    return cmd, proc.returncode, out, err


def parse(lines: str) -> list[tuple[int, int, str, str]]:
    """kcat's FORMAT lines as sorted (partition, offset, key, value)."""
    out = []
    for line in lines.splitlines():
        key, value, partition, offset = line.rsplit(":", 3)
        out.append((int(partition), int(offset), key, value))
    return sorted(out)


def create_topic(cluster, topic: str) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, PARTITIONS, 3)])


def deltabus_records(cluster, topic: str, count: int) -> list[tuple[int, int, str, str]]:
    got = read_records(cluster.bootstrap_servers, topic, PARTITIONS, count)
    return sorted((r.partition, r.offset, r.key.decode(), r.value.decode()) for r in got)


def test_kcat_lists_the_brokers_and_the_topic(cluster, topic_name) -> None:
    create_topic(cluster, topic_name)
    listing = kcat(cluster, "-L")
    with AdminClient(cluster.bootstrap_servers) as admin:
        brokers = admin.describe_cluster()["brokers"]
        [topic] = admin.describe_topics([topic_name])
    listed = dict(re.findall(r"^  broker (\d+) at (\S+?)(?: \(controller\))?$", listing, re.M))
    assert re.search(rf"^ {len(listed)} brokers:$", listing, re.M)
    # Every broker at its Kafka listener; nothing else but, perhaps, the bootstrap's listener.
    assert {str(b.broker_id): f"{b.host}:{b.kafka_port}" for b in brokers}.items() <= listed.items()
    assert set(listed.values()) <= ({f"{b.host}:{b.kafka_port}" for b in brokers}
                                    | {cluster.kafka_bootstrap_servers})
    # The topic's block: its partitions with their replicas (leaders may move meanwhile).
    block = listing.split(f'  topic "{topic_name}" with {PARTITIONS} partitions:\n')[1]
    parts = re.findall(r"^    partition (\d+), leader (\d+), replicas: ([\d,]+), isrs: ([\d,]+)$",
                       block, re.M)[:PARTITIONS]
    assert [(int(p), replicas) for p, _, replicas, _ in parts] == [
        (s.partition, ",".join(map(str, s.replicas))) for s in topic.partitions]
    for _, leader, replicas, _ in parts:
        assert leader in replicas.split(",")


def test_kcat_produces_keyed_lines_deltabus_reads_and_kcat_reads_back(cluster, topic_name) -> None:
    create_topic(cluster, topic_name)
    lines = [(f"user{i % 4}", f"paid {i}") for i in range(20)]
    kcat(cluster, "-P", "-t", topic_name, "-K:", stdin="".join(f"{k}:{v}\n" for k, v in lines))

    stored = deltabus_records(cluster, topic_name, len(lines))
    partition_of = {key: p for p, _, key, _ in stored}
    assert len({(p, key) for p, _, key, _ in stored}) == len(partition_of) == 4  # one per key
    expected: list[tuple[int, int, str, str]] = []
    for p in range(PARTITIONS):  # each partition from offset 0, in the order the lines came
        sent = [(k, v) for k, v in lines if partition_of[k] == p]
        expected += [(p, offset, k, v) for offset, (k, v) in enumerate(sent)]
    assert stored == sorted(expected)

    consumed = kcat(cluster, "-C", "-t", topic_name, "-e", "-o", "beginning", "-f", FORMAT)
    assert parse(consumed) == stored


def test_kcat_group_consumer_commits_and_resumes(cluster, topic_name) -> None:
    group = f"{topic_name}-g"
    create_topic(cluster, topic_name)

    def produce(start: int, count: int) -> list[tuple[int, int, str, str]]:
        sent = [(f"user{i}", f"paid {i}") for i in range(start, start + count)]
        with Producer(cluster.bootstrap_servers) as producer:
            futures = [producer.send(topic_name, v.encode(), key=k.encode()) for k, v in sent]
            producer.flush()
            return sorted(((m := f.get(30)).partition, m.offset, k, v)
                          for f, (k, v) in zip(futures, sent, strict=True))

    def consume() -> list[tuple[int, int, str, str]]:
        return parse(kcat(cluster, "-G", group, "-X", "auto.offset.reset=earliest", "-e",
                          "-f", FORMAT, topic_name))

    def ends(records: list[tuple[int, int, str, str]]) -> dict[tuple[str, int], int]:
        out: dict[tuple[str, int], int] = {}
        for p, offset, _, _ in records:
            out[(topic_name, p)] = max(out.get((topic_name, p), 0), offset + 1)
        return out

    first = produce(0, 15)
    assert consume() == first
    with AdminClient(cluster.bootstrap_servers) as admin:
        assert admin.list_consumer_group_offsets(group) == ends(first)

    second = produce(15, 6)  # a second run reads only what came after the group's commits
    assert consume() == second
    with AdminClient(cluster.bootstrap_servers) as admin:
        assert admin.list_consumer_group_offsets(group) == ends(first + second)
