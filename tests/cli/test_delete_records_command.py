"""`deltabus delete-records` as kafka-delete-records.sh: the same offset JSON file and the same
report lines, a partition's error as a line of the report, a bad file as a one-line error."""

from __future__ import annotations

import json
from pathlib import Path

from deltabus import AdminClient, Consumer, NewTopic, Producer, TopicPartition


def offset_file(tmp_path: Path, name: str, partitions: list[dict]) -> str:
    path = tmp_path / name
    path.write_text(json.dumps({"partitions": partitions, "version": 1}))
    return str(path)


def test_delete_records_reports_each_partition_as_kafka_does(
        cli, cluster, topic_name, tmp_path) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3)])
    with Producer(cluster.bootstrap_servers) as producer:
        for i in range(10):
            producer.send(topic_name, f"v{i}".encode(), partition=0)
    plan = offset_file(tmp_path, "offsets.json",
                       [{"topic": topic_name, "partition": 0, "offset": 3}])
    rc, out, err = cli("delete-records", "--offset-json-file", plan)
    assert (rc, err) == (0, "")
    assert out == ("Executing records delete operation\n"
                   "Records delete operation completed:\n"
                   f"partition: {topic_name}-0\tlow_watermark: 3\n")
    tp = TopicPartition(topic_name, 0)
    with Consumer(cluster.bootstrap_servers) as consumer:
        assert consumer.beginning_offsets([tp])[tp] == 3

    too_far = offset_file(tmp_path, "too-far.json", [
        {"topic": topic_name, "partition": 0, "offset": 99},
        {"topic": topic_name, "partition": 4, "offset": -1}])
    rc, out, err = cli("delete-records", "--offset-json-file", too_far)
    lines = out.splitlines()
    assert rc == 0 and lines[:2] == ["Executing records delete operation",
                                     "Records delete operation completed:"]
    assert lines[2].startswith(f"partition: {topic_name}-0\terror: OFFSET_OUT_OF_RANGE")
    assert lines[3].startswith(f"partition: {topic_name}-4\terror: UNKNOWN_TOPIC_OR_PARTITION")

    everything = offset_file(tmp_path, "all.json",
                             [{"topic": topic_name, "partition": 0, "offset": -1}])
    rc, out, _ = cli("delete-records", "--offset-json-file", everything)
    assert rc == 0 and out.endswith(f"partition: {topic_name}-0\tlow_watermark: 10\n")


def test_a_bad_offset_file_is_a_one_line_error(cli, tmp_path) -> None:
    not_json = tmp_path / "bad.json"
    not_json.write_text("{partitions")
    twice = offset_file(tmp_path, "twice.json", [{"topic": "t", "partition": 0, "offset": 1}] * 2)
    no_offset = offset_file(tmp_path, "short.json", [{"topic": "t", "partition": 0}])
    for path, said in ((str(not_json), "not a valid JSON"),
                       (twice, "duplicate topic partitions: t-0"),
                       (no_offset, "missing or bad 'offset'"),
                       (str(tmp_path / "none.json"), "cannot read")):
        rc, out, err = cli("delete-records", "--offset-json-file", path)
        assert rc == 1 and out == "", (path, out)
        assert err.count("\n") == 1 and err.startswith("Error: ") and said in err, err
