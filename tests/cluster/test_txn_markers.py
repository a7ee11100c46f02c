"""WriteTxnMarkers on a real cluster, called as the transaction coordinator will: the internal
TxnMarkers API of a partition's leader, with the cluster's broker credential. The marker becomes a
control row every in-sync replica's table holds before the call answers; a follower answers
NOT_LEADER_OR_FOLLOWER, an older epoch INVALID_PRODUCER_EPOCH, a caller without the credential
CLUSTER_AUTHORIZATION_FAILED."""

from __future__ import annotations

import pyarrow.compute as pc
from deltalake import DeltaTable

from deltabus import AdminClient, NewTopic, errors
from deltabus.log_tables.control_records import (
    TXN_FIRST_OFFSET_HEADER,
    TxnMarker,
    control_key,
    control_mask,
)
from deltabus.log_tables.layout import replica_path
from deltabus.rpc.txn_markers import write_txn_markers


def _replica_markers(cluster, topic: str, broker_id: int):
    table = DeltaTable(replica_path(cluster.config.root, topic, 0, broker_id)).to_pyarrow_table()
    return table.filter(control_mask(table)).sort_by("offset")


def test_a_marker_is_a_control_row_on_every_in_sync_replica_when_answered(cluster, topic_name):
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3)])
    state = cluster.controller.image().partition(topic_name, 0)
    leader = cluster.controller.image().broker(state.leader).address
    secret = cluster.config.inter_broker_secret
    abort = TxnMarker(producer_id=5000, producer_epoch=2, committed=False, coordinator_epoch=7,
                      partitions=((topic_name, 0),))
    key = (5000, topic_name, 0)
    assert write_txn_markers(leader, [abort], timeout_ms=30_000, broker_secret=secret) == {
        key: None}
    for broker_id in state.isr:  # acks=all: every in-sync replica has it already
        rows = _replica_markers(cluster, topic_name, broker_id)
        assert rows.num_rows == 1, broker_id
        assert rows.column("key").to_pylist() == [control_key(False)]
        assert rows.column("producer_epoch").to_pylist() == [2]
        assert rows.column("headers").to_pylist() == [[{"key": TXN_FIRST_OFFSET_HEADER,
                                                        "value": b"-1"}]]
    # An older epoch is refused; a follower is not the leader; a stranger is no broker.
    stale = TxnMarker(5000, 1, True, 7, ((topic_name, 0),))
    outcome = write_txn_markers(leader, [stale], timeout_ms=30_000, broker_secret=secret)
    assert isinstance(outcome[key], errors.InvalidProducerEpochError)
    follower = next(r for r in state.replicas if r != state.leader)
    address = cluster.controller.image().broker(follower).address
    outcome = write_txn_markers(address, [abort], timeout_ms=30_000, broker_secret=secret)
    assert isinstance(outcome[key], errors.NotLeaderOrFollowerError)
    outcome = write_txn_markers(leader, [abort], timeout_ms=30_000, broker_secret="guessed")
    assert isinstance(outcome[key], errors.ClusterAuthorizationFailedError)
    rows = _replica_markers(cluster, topic_name, state.leader)
    assert pc.sum(rows.column("producer_epoch")).as_py() == 2  # still the one marker
