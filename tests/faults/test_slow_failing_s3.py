"""Slow and failing object storage (issue 40): the storage layer, the Delta commit writer, a
partition log, the controller's metadata log (alone and under a Controller, no Spark) and
`__consumer_offsets` (the offset store) on an S3 root behind the fault proxy (s3_fault_proxy.py)
in front of moto, then a 3-broker cluster on it under acks=all load.

What must hold: transient 503 SlowDown and 500 InternalError are retried and nothing is lost or
doubled; a commit whose answer was lost is acknowledged once if it landed (the store's retry of
a conditional put is refused, 412, by the commit's own first try) and never acknowledged if it
did not, or if its outcome cannot be known (what landed is then applied before the next write,
so the state equals the log again); slow storage slows appends and fails none; storage
that keeps failing fails appends with KAFKA_STORAGE_ERROR (retriable) within the retry
settings given (delta-rs's names: max_retries, retry_timeout, backoff_config.*), and the high
watermark stays at what was written. The cluster's checker: every acknowledged record is read,
once, in order, and none is in the log twice. Every fault the proxy injects is in the test's
history file (history.jsonl under its tmp_path), with the cluster run's acknowledgements."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from deltabus import AdminClient, Cluster, NewTopic, errors
from deltabus import config as cfg
from deltabus.cluster.controller import Controller
from deltabus.cluster.metadata_log import MetadataLog
from deltabus.log_tables.appender import AppendResult
from deltabus.log_tables.delta_commit import DeltaCommitWriter
from deltabus.log_tables.layout import metadata_path, replica_path, topic_path
from deltabus.log_tables.partition_log import PartitionLog, create_log_table
from deltabus.metadata import BrokerEndpoint
from deltabus.offsets.offset_store import OffsetAndMetadata, OffsetCommit, OffsetStore
from deltabus.records import normalize_produce, produce_batch, to_log_batch
from deltabus.storage import Storage
from tests.conftest import wait_until
from tests.faults.history import History, read_history
from tests.faults.s3_fault_proxy import (
    ANSWER_LOST,
    COMMIT_FILES,
    DELAY,
    INTERNAL_ERROR,
    SLOW_DOWN,
    TIMEOUT,
    Rule,
    S3FaultProxy,
)
from tests.soak.fault_injection import (
    DeltabusSender,
    FaultPlan,
    KafkaSender,
    Ledger,
    Worker,
    create_topic,
    read_log,
    wait_for,
)

# Retries in tens of milliseconds, not object_store's default backoff (100 ms doubling to 15 s):
# a store that keeps failing fails a commit in well under a second.
FAST_RETRIES = {"max_retries": "3", "retry_timeout": "10s",
                "backoff_config.init_backoff": "10ms", "backoff_config.max_backoff": "50ms"}
METADATA_COMMITS = "*/__cluster_metadata/_delta_log/*.json"  # the controller's metadata log
# A request unanswered for 1 s times out (object_store's default: 30 s).
SHORT_TIMEOUT = {"timeout": "1s"}
APPEND_TIMEOUT_S = 60


@pytest.fixture
def history(tmp_path: Path) -> Iterator[History]:
    with History(tmp_path / "history.jsonl") as h:
        yield h


@pytest.fixture
def proxy(s3: Any, history: History) -> Iterator[S3FaultProxy]:
    with S3FaultProxy(s3.endpoint, history=history) as p:
        yield p


def _table_uri(s3: Any) -> str:
    return f"{s3.create_bucket(f'faults-{uuid.uuid4().hex[:8]}')}/orders-0"


def _log(s3: Any, proxy: S3FaultProxy, **options: str) -> tuple[PartitionLog, str]:
    """A partition log on a new bucket, reached through the proxy; its table's URI."""
    uri = _table_uri(s3)
    storage = Storage(uri, {**proxy.options(s3.options()), **options})
    return PartitionLog(uri, topic="orders", partition=0, storage=storage), uri


def _append(log: PartitionLog, value: bytes) -> Future[AppendResult]:
    return log.append(normalize_produce(produce_batch([value], keys=[b"k"])), leader_epoch=1)


def _table_values(s3: Any, uri: str) -> list[bytes]:
    """The records the table holds, in offset order, read straight from moto (no proxy);
    their offsets must run from 0 with no gap."""
    table = DeltaTable(uri, storage_options=s3.options()).to_pyarrow_table().sort_by("offset")
    assert table.column("offset").to_pylist() == list(range(table.num_rows))
    return table.column("value").to_pylist()


def _faults_in_history(history: History) -> dict[str, int]:
    """How many of each fault the history file records as started."""
    counts: dict[str, int] = {}
    for line in read_history(history.path):
        if line["process"] == "nemesis" and line["f"].startswith("start-s3-"):
            counts[line["f"][len("start-s3-"):]] = counts.get(line["f"][len("start-s3-"):], 0) + 1
    return counts


def test_transient_503s_and_500s_are_retried_and_nothing_is_lost_or_doubled(
        s3: Any, proxy: S3FaultProxy, history: History) -> None:
    log, uri = _log(s3, proxy)
    proxy.add(Rule(SLOW_DOWN, probability=0.3))
    proxy.add(Rule(INTERNAL_ERROR, probability=0.2))
    values = [f"v{i}".encode() for i in range(10)]
    results = [_append(log, v).result(APPEND_TIMEOUT_S) for v in values]
    proxy.clear()
    assert [r.base_offset for r in results] == list(range(10))
    assert log.high_watermark == log.log_end_offset == 10
    assert _table_values(s3, uri) == values
    log.close()
    faults = _faults_in_history(history)
    assert faults.get(SLOW_DOWN, 0) > 0 and faults.get(INTERNAL_ERROR, 0) > 0, faults


def _writer(s3: Any, proxy: S3FaultProxy, **options: str) -> tuple[DeltaCommitWriter, str]:
    """A commit writer of a new, empty partition table, through the proxy."""
    uri = _table_uri(s3)
    PartitionLog(uri, topic="orders", partition=0, storage=Storage(uri, s3.options())).close()
    storage = Storage(uri, {**proxy.options(s3.options()), **options})
    return DeltaCommitWriter(storage, uri, 0), uri


def _one_record(offset: int, value: bytes) -> Any:
    return to_log_batch(normalize_produce(produce_batch([value], keys=[b"k"])),
                        base_offset=offset, now_ms=1_700_000_000_000, leader_epoch=1)


def test_a_commit_whose_answer_was_lost_is_its_writers_not_a_conflict(
        s3: Any, proxy: S3FaultProxy) -> None:
    """The put of the commit file lands, its answer is lost, object_store retries it and S3
    refuses the retry (412: the first try's own file is there). The writer must see its own
    commit there, not another writer's."""
    writer, uri = _writer(s3, proxy)
    proxy.add(Rule(ANSWER_LOST, key=COMMIT_FILES, method="PUT", times=1))
    assert writer.commit(adds=[writer.write_file(_one_record(0, b"once"))]) == 1
    assert proxy.count(ANSWER_LOST) == 1
    assert writer.commit(adds=[writer.write_file(_one_record(1, b"next"))]) == 2
    assert _table_values(s3, uri) == [b"once", b"next"]


def test_a_commit_that_landed_though_its_put_failed_is_committed(
        s3: Any, proxy: S3FaultProxy) -> None:
    """The put lands and its answer is lost; object_store's retry times out (a conditional put
    is not retried after a timeout): the put failed, but the commit is in the table, and is
    this writer's."""
    writer, uri = _writer(s3, proxy, **SHORT_TIMEOUT)
    proxy.add(Rule(ANSWER_LOST, key=COMMIT_FILES, method="PUT", times=1))
    proxy.add(Rule(TIMEOUT, key=COMMIT_FILES, method="PUT", times=1, seconds=30))
    assert writer.commit(adds=[writer.write_file(_one_record(0, b"once"))]) == 1
    assert (proxy.count(ANSWER_LOST), proxy.count(TIMEOUT)) == (1, 1)
    assert _table_values(s3, uri) == [b"once"]


@pytest.mark.parametrize("then", ["refused", "timed-out"])
def test_an_append_whose_commit_answer_was_lost_is_acknowledged_once(
        s3: Any, proxy: S3FaultProxy, history: History, then: str) -> None:
    """The producer's view of the two cases above: the append is acknowledged at its offset,
    and the next one follows it; the table holds each record once."""
    log, uri = _log(s3, proxy, **SHORT_TIMEOUT)
    proxy.add(Rule(ANSWER_LOST, key=COMMIT_FILES, method="PUT", times=1))
    if then == "timed-out":
        proxy.add(Rule(TIMEOUT, key=COMMIT_FILES, method="PUT", times=1, seconds=30))
    history.invoke("producer", "send", "lost")
    first = _append(log, b"lost").result(APPEND_TIMEOUT_S)
    history.ok("producer", "send", {"value": "lost", "offset": first.base_offset})
    second = _append(log, b"after").result(APPEND_TIMEOUT_S)
    assert (first.base_offset, second.base_offset) == (0, 1)
    assert log.high_watermark == 2
    assert _table_values(s3, uri) == [b"lost", b"after"]
    log.close()
    assert _faults_in_history(history)[ANSWER_LOST] == 1


def test_a_table_whose_creating_commits_lost_their_answers_is_created(
        s3: Any, proxy: S3FaultProxy) -> None:
    """The controller creates a new replica's table with delta-rs (mode "ignore"). Its put of
    version 0 lands and the answer is lost; object_store's retry is refused by that file, and
    delta-rs tries again at version 1 (a second metaData commit), whose answer is lost too:
    delta-rs then finds version 1 "changed the protocol" and fails the create, though the
    table is there."""
    uri = _table_uri(s3)
    for version in (0, 1):
        proxy.add(Rule(ANSWER_LOST, key=f"*_delta_log/{version:020d}.json", method="PUT",
                       times=1))
    create_log_table(uri, topic="orders", partition=0, checkpoint_interval=25,
                     storage_options=proxy.options(s3.options()))
    assert proxy.count(ANSWER_LOST) == 2
    log = PartitionLog(uri, topic="orders", partition=0, create=False,
                       storage=Storage(uri, proxy.options(s3.options())))
    assert _append(log, b"first").result(APPEND_TIMEOUT_S).base_offset == 0
    log.close()
    assert _table_values(s3, uri) == [b"first"]


def test_a_commit_that_did_not_land_is_never_acknowledged(
        s3: Any, proxy: S3FaultProxy) -> None:
    """The put of the commit file never reaches the store (held, then the client times out):
    the append fails with KAFKA_STORAGE_ERROR, the log end and the high watermark stay, and
    the next append takes the same offset."""
    log, uri = _log(s3, proxy, **SHORT_TIMEOUT)
    _append(log, b"before").result(APPEND_TIMEOUT_S)
    proxy.add(Rule(TIMEOUT, key=COMMIT_FILES, method="PUT", times=1, seconds=30))
    with pytest.raises(errors.KafkaStorageError) as failed:
        _append(log, b"never").result(APPEND_TIMEOUT_S)
    assert failed.value.retriable
    assert log.log_end_offset == log.high_watermark == 1
    assert _append(log, b"after").result(APPEND_TIMEOUT_S).base_offset == 1
    assert _table_values(s3, uri) == [b"before", b"after"]
    log.close()


def test_a_commit_whose_outcome_stays_unknown_fails_and_the_log_recovers_from_the_table(
        s3: Any, proxy: S3FaultProxy) -> None:
    """The put lands with its answer lost, the retry times out, and the read-back fails too
    (503 on every read of a commit file): the outcome is unknown, so the append fails with
    KAFKA_STORAGE_ERROR and is not acknowledged. Once the store answers, the log takes what
    the table holds (the record is there, unacknowledged, as a timed-out produce may be on
    Kafka) and appends after it. The reload after the failure failed too (the store still
    refused reads), so the next append meets the unknown commit and fails as well (retriable,
    nothing of it written); the log reloads and the one after goes through."""
    log, uri = _log(s3, proxy, **FAST_RETRIES, **SHORT_TIMEOUT)
    _append(log, b"before").result(APPEND_TIMEOUT_S)
    proxy.add(Rule(ANSWER_LOST, key=COMMIT_FILES, method="PUT", times=1))
    proxy.add(Rule(TIMEOUT, key=COMMIT_FILES, method="PUT", times=1, seconds=30))
    proxy.add(Rule(SLOW_DOWN, key=COMMIT_FILES, method="GET"))
    with pytest.raises(errors.KafkaStorageError):
        _append(log, b"unknown").result(APPEND_TIMEOUT_S)
    assert log.high_watermark == 1
    proxy.clear()
    with pytest.raises(errors.KafkaStorageError):
        _append(log, b"refused").result(APPEND_TIMEOUT_S)
    assert _append(log, b"after").result(APPEND_TIMEOUT_S).base_offset == 2
    assert log.high_watermark == 3
    assert _table_values(s3, uri) == [b"before", b"unknown", b"after"]
    log.close()


def _outcome_unknown(proxy: S3FaultProxy, key: str, *, lands: bool = True) -> None:
    """The next put of a commit file matching `key` lands (`lands`, its answer lost, then
    object_store's retry times out) or never reaches the store (held until the client times
    out); either way every read of such a file gets 503 SlowDown until the rules are cleared,
    so the writer cannot learn whether its commit is in the table."""
    if lands:
        proxy.add(Rule(ANSWER_LOST, key=key, method="PUT", times=1))
    proxy.add(Rule(TIMEOUT, key=key, method="PUT", times=1, seconds=30))
    proxy.add(Rule(SLOW_DOWN, key=key, method="GET"))


def _stored_metadata(s3: Any, root: str) -> list[dict[str, Any]]:
    """The metadata log's records in offset order, read straight from moto (no proxy); their
    offsets must run from 0 with no gap."""
    table = DeltaTable(metadata_path(root), storage_options=s3.options()).to_pyarrow_table()
    table = table.sort_by("offset")
    assert table.column("offset").to_pylist() == list(range(table.num_rows))
    return [json.loads(r) for r in table.column("record").to_pylist()]


@pytest.mark.parametrize("lands", [True, False], ids=["landed", "not-landed"])
def test_a_metadata_append_whose_outcome_stays_unknown_is_reloaded_before_the_next(
        s3: Any, proxy: S3FaultProxy, lands: bool) -> None:
    """The metadata log's append lands (or not) and cannot be checked: it fails, and the log
    refuses to append after it until `reload` has read what the table holds (raising while
    the store still fails). Once the store answers, `reload` gives the records of the append
    that landed (none if it did not), and the next append follows them: each record once,
    offsets contiguous. On the old code every append after the unknown one failed with
    CommitConflict ("reported failed"), until a restart replayed the refused records."""
    root = f"{s3.create_bucket(f'meta-{uuid.uuid4().hex[:8]}')}/deltabus"
    log = MetadataLog(metadata_path(root),
                      {**proxy.options(s3.options()), **FAST_RETRIES, **SHORT_TIMEOUT})
    log.read_all()
    first = {"type": "cluster", "cluster_id": "c-1"}
    unknown = {"type": "config", "topic": "orders", "key": "retention.ms", "value": "1000"}
    after = {"type": "config", "topic": "orders", "key": "cleanup.policy", "value": "compact"}
    log.append([first])
    _outcome_unknown(proxy, METADATA_COMMITS, lands=lands)
    with pytest.raises(errors.KafkaStorageError):
        log.append([unknown])
    assert log.next_offset == 1
    with pytest.raises(errors.KafkaStorageError):  # the store still fails: still unknown
        log.reload()
    with pytest.raises(errors.KafkaStorageError, match="unknown"):
        log.append([after])
    proxy.clear()
    assert log.reload() == ([unknown] if lands else [])
    assert log.reload() == []  # known now: nothing more to reload
    log.append([after])
    held = [first, unknown, after] if lands else [first, after]
    assert log.next_offset == len(held)
    assert _stored_metadata(s3, root) == held
    assert MetadataLog(metadata_path(root), s3.options()).read_all() == held


def _controller(s3: Any, proxy: S3FaultProxy) -> tuple[Controller, str]:
    """A controller (no Spark, no brokers' processes) on a new bucket through the proxy, with
    one registered and unfenced broker and the topic "orders"; its root."""
    root = f"{s3.create_bucket(f'ctl-{uuid.uuid4().hex[:8]}')}/deltabus"
    options = {**proxy.options(s3.options()), **FAST_RETRIES, **SHORT_TIMEOUT}
    controller = Controller(cfg.ClusterConfig(root=root, brokers=1, kafka_port=-1,
                                              storage_options=options))
    epoch = controller.register_broker(BrokerEndpoint(0, "127.0.0.1", 9000), 100)
    controller.heartbeat(0, epoch, controller.image().version, 0)
    [created] = controller.create_topics([NewTopic("orders")], timeout_ms=0)
    assert created.error is None
    return controller, root


def _set(controller: Controller, key: str, value: str) -> errors.DeltaBusError | None:
    return controller.alter_configs({"orders": [cfg.AlterConfigOp(key, cfg.SET, value)]},
                                    timeout_ms=0)["orders"]


@pytest.mark.parametrize("then", ["reload", "next-write"])
def test_a_controller_whose_metadata_append_outcome_is_unknown_applies_what_landed(
        s3: Any, proxy: S3FaultProxy, then: str) -> None:
    """A config change whose metadata commit lands with its outcome unknown is refused
    (KAFKA_STORAGE_ERROR), and the controller's state stays what the log is known to hold.
    Once the store answers, the controller reloads the log's end, as KRaft's controller
    reloads after an append it cannot know: either the session checker's `reload_metadata`
    (then the next change goes through), or the next write itself, which applies the landed
    record and is refused, retriably, as it was decided without it; the one after goes
    through. The image then holds the landed change, as the log and a restart do, and the
    log holds each record once. On the old code every write after the unknown one failed
    (CommitConflict, "reported failed") until a restart, which applied the refused change."""
    controller, root = _controller(s3, proxy)
    version = controller.image().version
    _outcome_unknown(proxy, METADATA_COMMITS)
    assert isinstance(_set(controller, "retention.ms", "1000"), errors.KafkaStorageError)
    assert controller.image().topics["orders"].configs == {}
    assert controller.image().version == version
    proxy.clear()
    if then == "reload":
        assert controller.reload_metadata()
        assert controller.image().topics["orders"].configs == {"retention.ms": "1000"}
    else:
        refused = _set(controller, "cleanup.policy", "compact")
        assert isinstance(refused, errors.KafkaStorageError) and refused.retriable
    assert _set(controller, "cleanup.policy", "compact") is None
    assert controller.image().version == version + 2
    configs = {"retention.ms": "1000", "cleanup.policy": "compact"}
    assert controller.image().topics["orders"].configs == configs
    assert [(r.get("key"), r.get("value")) for r in _stored_metadata(s3, root)
            if r["type"] == "config"] == [("retention.ms", "1000"),
                                          ("cleanup.policy", "compact")]
    restarted = Controller(cfg.ClusterConfig(root=root, brokers=1, kafka_port=-1,
                                             storage_options=s3.options()))
    assert restarted.image().topics == controller.image().topics


@pytest.mark.parametrize("lands", [True, False], ids=["landed", "not-landed"])
def test_a_topic_whose_creation_outcome_is_unknown_keeps_its_tables_if_it_landed(
        s3: Any, proxy: S3FaultProxy, lands: bool) -> None:
    """CreateTopics makes the replica tables, then the metadata commit naming them, whose
    outcome is unknown: the create fails. A table is removed only once the reloaded log shows
    the commit did not land (then a create of the same name goes through); if it landed, the
    topic is the cluster's and its tables stay. On the old code the failed create removed the
    tables at once, and the landed topic had none (a missing table means lost records)."""
    controller, root = _controller(s3, proxy)
    table = replica_path(root, "lost", 0, 0)
    _outcome_unknown(proxy, METADATA_COMMITS, lands=lands)
    [failed] = controller.create_topics([NewTopic("lost")], timeout_ms=0)
    assert isinstance(failed.error, errors.KafkaStorageError)
    assert "lost" not in controller.image().topics
    proxy.clear()
    storage = Storage(root, s3.options())
    if lands:
        assert controller.reload_metadata()
        assert "lost" in controller.image().topics
        time.sleep(2)  # the removal's first tries (0.5 s, then 1 s) leave it
        assert DeltaTable(table, storage_options=s3.options()).version() == 0
    else:
        wait_until(lambda: not storage.exists(topic_path(root, "lost")),
                   "the tables of the topic that did not land removed", 30)
        [created] = controller.create_topics([NewTopic("lost")], timeout_ms=0)
        assert created.error is None
    topics = [r["name"] for r in _stored_metadata(s3, root) if r["type"] == "topic"]
    assert topics == ["orders", "lost"]


def _committed(store: OffsetStore) -> dict[int, int]:
    return {p: om.offset for (_, p), om in store.offsets("g").items()}


def _commit_offset(store: OffsetStore, partition: int, offset: int) -> None:
    store.commit([OffsetCommit("g", "t", partition, OffsetAndMetadata(offset))]).result(
        APPEND_TIMEOUT_S)


@pytest.mark.parametrize("lands", [True, False], ids=["landed", "not-landed"])
def test_an_offset_commit_whose_outcome_stays_unknown_is_reloaded_before_the_next(
        s3: Any, proxy: S3FaultProxy, lands: bool) -> None:
    """`__consumer_offsets`' append lands (or not) and cannot be checked: the commit fails and
    the store's memory stays as it was; so does the next one while the store still cannot
    tell. Once the store answers, the next write applies first
    what landed, then goes through; a group's deletion then tombstones the landed offset too.
    Memory, the table and a restart agree, each row once. On the old code every commit after
    the unknown one failed (CommitConflict, "reported failed")."""
    path = f"{s3.create_bucket(f'offsets-{uuid.uuid4().hex[:8]}')}/__consumer_offsets"
    store = OffsetStore(path, commit_linger_ms=0, storage_options={
        **proxy.options(s3.options()), **FAST_RETRIES, **SHORT_TIMEOUT})
    try:
        _commit_offset(store, 0, 10)
        _outcome_unknown(proxy, COMMIT_FILES, lands=lands)
        with pytest.raises(errors.KafkaStorageError):
            _commit_offset(store, 1, 20)
        with pytest.raises(errors.KafkaStorageError, match="cannot reload"):
            _commit_offset(store, 3, 40)  # the store still cannot tell: nothing written
        assert _committed(store) == {0: 10}
        proxy.clear()
        _commit_offset(store, 2, 30)
        held = {0: 10, 1: 20, 2: 30} if lands else {0: 10, 2: 30}
        assert _committed(store) == held
        table = DeltaTable(path, storage_options=s3.options()).to_pyarrow_table()
        assert sorted(table.column("partition").to_pylist()) == sorted(held)
        reopened = OffsetStore(path, storage_options=s3.options())
        assert _committed(reopened) == held
        reopened.close()
        store.delete_group("g").result(APPEND_TIMEOUT_S)
        assert not store.has_group("g")
    finally:
        store.close()
    reopened = OffsetStore(path, storage_options=s3.options())
    assert not reopened.has_group("g")
    reopened.close()


def test_slow_storage_slows_appends_and_fails_none(s3: Any, proxy: S3FaultProxy) -> None:
    """Every request waits 0.2 s; reads and idempotent writes held past the client's timeout
    are retried: every append is acknowledged, in order, and read back."""
    log, uri = _log(s3, proxy, **SHORT_TIMEOUT)
    proxy.add(Rule(TIMEOUT, key="*.parquet", method="PUT", times=1, seconds=30))
    proxy.add(Rule(DELAY, seconds=0.2))
    values = [f"slow-{i}".encode() for i in range(5)]
    futures = [_append(log, v) for v in values]
    results = [f.result(APPEND_TIMEOUT_S) for f in futures]
    assert sorted(r.base_offset for r in results) == list(range(5))
    assert proxy.count(TIMEOUT) == 1 and proxy.count(DELAY) > 0
    storage = Storage(uri, {**proxy.options(s3.options()), **SHORT_TIMEOUT})
    proxy.add(Rule(TIMEOUT, key="*_delta_log/*", method="GET", times=1, seconds=30))
    assert storage.read_bytes(f"{uri}/_delta_log/{1:020d}.json")  # retried after 1 s
    ordered = [v for _, v in sorted(zip([r.base_offset for r in results], values,
                                        strict=True))]
    assert _table_values(s3, uri) == ordered
    log.close()


def test_storage_that_keeps_failing_fails_appends_retriably_and_holds_the_high_watermark(
        s3: Any, proxy: S3FaultProxy) -> None:
    log, uri = _log(s3, proxy, **FAST_RETRIES)
    for value in (b"a", b"b", b"c"):
        _append(log, value).result(APPEND_TIMEOUT_S)
    proxy.add(Rule(SLOW_DOWN, method="PUT"))
    for _ in range(3):
        with pytest.raises(errors.KafkaStorageError) as failed:
            _append(log, b"refused").result(APPEND_TIMEOUT_S)
        assert failed.value.retriable
        assert log.log_end_offset == log.high_watermark == 3
    proxy.clear()
    assert _append(log, b"d").result(APPEND_TIMEOUT_S).base_offset == 3
    assert log.high_watermark == 4
    assert _table_values(s3, uri) == [b"a", b"b", b"c", b"d"]
    log.close()


def test_delta_rs_retry_options_bound_deltabus_own_requests(
        s3: Any, proxy: S3FaultProxy) -> None:
    """max_retries (delta-rs's name, which object_store's RetryConfig has too) reaches
    deltabus's own requests, not delta-rs's alone: a put refused every time is tried once and
    retried max_retries times."""
    storage = Storage(_table_uri(s3), {**proxy.options(s3.options()), **FAST_RETRIES})
    proxy.add(Rule(SLOW_DOWN, method="PUT"))
    with pytest.raises(errors.KafkaStorageError):
        storage.write(f"{storage.root}/refused", b"x")
    assert proxy.count(SLOW_DOWN) == 1 + int(FAST_RETRIES["max_retries"])


def _check_acked_read_once_in_order(acked: dict[bytes, tuple[int, int]],
                                    stored: dict[tuple[int, int], bytes]) -> None:
    """Every acknowledged record is read once, at the offset it was acknowledged at, each
    sender's in the order sent within a partition; no record is in the log twice,
    acknowledged or not."""
    places: dict[bytes, list[tuple[int, int]]] = {}
    for where, value in stored.items():
        places.setdefault(value, []).append(where)
    twice = {v: p for v, p in places.items() if len(p) > 1}
    assert not twice, f"in the log twice: {sorted(twice.items())[:5]}"
    told = {v: where for v, where in acked.items() if where[1] is not None and where[1] >= 0}
    misplaced = {v: where for v, where in told.items() if stored.get(where) != v}
    assert not misplaced, f"acknowledged but not read there: {sorted(misplaced.items())[:5]}"
    assert all(v in places for v in acked), "an acknowledged record without an offset is lost"
    by_sender: dict[tuple[str, int], list[tuple[bytes, int]]] = {}
    for value, (partition, offset) in told.items():
        by_sender.setdefault((value.decode().split("-")[0], partition), []).append(
            (value, offset))
    for sent in by_sender.values():  # values end in the sender's sequence number
        offsets = [offset for _, offset in sorted(sent)]
        assert offsets == sorted(offsets), "a sender's records out of order"


@pytest.mark.timeout(600)
def test_acks_all_producers_through_503s_and_lost_commit_answers_lose_and_double_nothing(
        spark: Any, s3: Any, tmp_path: Path) -> None:
    """A 3-broker cluster on S3 behind the proxy; a deltabus Producer and confluent-kafka (the
    Kafka door), idempotent at acks=all, load a topic of RF 3 while a third of the commit
    files' puts get 503 SlowDown and a fifth lose their answer, until each fault was injected
    a dozen times with the load still acknowledged (seconds); a topic created meanwhile has
    its metadata commit's answer lost. Then every acknowledged record is read back once, in
    order, none is in the log twice, the controller still writes its metadata log, and the
    history file holds the faults and the acknowledgements. On the old code the appends and
    copies whose answers were lost failed with KAFKA_STORAGE_ERROR (CommitConflict) though
    they landed, and the metadata log refused every write after its lost answer."""
    plan = FaultPlan("payments", partitions=2, deltabus_producers=1, records_per_s=40,
                     ready_timeout_s=120, flush_s=60)
    with History(tmp_path / "history.jsonl") as history, \
            S3FaultProxy(s3.endpoint, history=history) as proxy:
        root = f"{s3.create_bucket(f'cluster-{uuid.uuid4().hex[:8]}')}/deltabus"
        cluster = Cluster(spark, root=root, brokers=3, port=0,
                          storage_options=proxy.options(s3.options())).start()
        ledger = Ledger(history)  # every send, acknowledgement and failure to the history
        senders: list[Worker] = [
            DeltabusSender("p0", cluster.bootstrap_servers, plan, ledger),
            KafkaSender("k0", cluster.kafka_bootstrap_servers, plan, ledger)]
        try:
            create_topic(cluster, plan)
            for sender in senders:
                sender.start()
            wait_for(lambda: ledger.acked_count() >= 50, "records acknowledged", 120)
            before = ledger.acked_count()
            history.fault("s3-commit-faults", {"slow-down": 0.3, "answer-lost": 0.2})
            metadata = proxy.add(Rule(ANSWER_LOST, key=METADATA_COMMITS, method="PUT", times=1))
            proxy.add(Rule(SLOW_DOWN, key=COMMIT_FILES, method="PUT", probability=0.3))
            proxy.add(Rule(ANSWER_LOST, key=COMMIT_FILES, method="PUT", probability=0.2))
            with AdminClient(cluster.bootstrap_servers) as admin:
                admin.create_topics([NewTopic("created-during-faults", 1, 3)])
            wait_for(lambda: (proxy.count(SLOW_DOWN) >= 12 and proxy.count(ANSWER_LOST) >= 12
                              and ledger.acked_count() >= before + 100),
                     "faults injected under load", 120)
            proxy.clear()
            history.heal("s3-commit-faults", dict(proxy.injected))
            for sender in senders:
                sender.stop(plan.flush_s + 30)
            assert [s.error for s in senders] == [None] * len(senders)
            assert not any(s.is_alive() for s in senders)
            stored, _ = read_log(cluster.bootstrap_servers, plan)
            assert metadata.injected == 1
            with AdminClient(cluster.bootstrap_servers) as admin:
                admin.create_topics([NewTopic("created-after-faults", 1, 3)])
        finally:
            for sender in senders:
                sender.stop(plan.flush_s + 30)
            cluster.stop()
    print(f"{ledger.acked_count()} acknowledged, {ledger.failed_sends} failed sends, "
          f"{len(stored)} read; faults {proxy.injected}")
    _check_acked_read_once_in_order(ledger.acked, stored)
    assert _faults_in_history(history)[ANSWER_LOST] >= 12
    assert history.count("send") == ledger.acked_count()
