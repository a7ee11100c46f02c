"""The transaction coordinator's side of WriteTxnMarkers: markers sent to a partition leader over
the internal `TxnMarkers` API, with the cluster's broker credential (rpc.inter_broker), as the
replica fetcher sends its fetches (rpc.leader_endpoint).

`target` is the leader's inter-broker listener (host:port: `BrokerEndpoint.address` in the
metadata image, where followers fetch). The answer names every (producer id, topic, partition)
sent: None when the marker is in the ISR's logs, else the error: NOT_LEADER_OR_FOLLOWER (re-resolve
the leader and send again), INVALID_PRODUCER_EPOCH, REQUEST_TIMED_OUT, or, when the call itself
failed (the broker is down), that error for every one of them (NETWORK_EXCEPTION: retriable).

Thread-safe: one channel per target, opened on first use.
"""

from __future__ import annotations

import threading

import grpc

from deltabus import errors
from deltabus.config import ListenerSecurity
from deltabus.log_tables.control_records import TxnMarker
from deltabus.rpc.channel import open_channel
from deltabus.rpc.inter_broker import credential_metadata
from deltabus.rpc.status import error_from_rpc
from deltabus.rpc.tls import grpc_peer_credentials
from deltabus.rpc.v1 import internal_pb2 as ipb
from deltabus.rpc.v1 import internal_pb2_grpc as ipb_grpc

PLAINTEXT = ListenerSecurity()
REQUEST_GRACE_MS = 5_000  # beyond the markers' own timeout, for the call's round trip

MarkerOutcomes = dict[tuple[int, str, int], errors.DeltaBusError | None]


class TxnMarkerClient:
    """Sends markers to any broker of the cluster; keep one for the coordinator's life."""

    def __init__(self, *, broker_secret: str, security: ListenerSecurity = PLAINTEXT) -> None:
        """`broker_secret`: ClusterConfig.inter_broker_secret; `security`: the inter-broker
        listener's (ClusterConfig.listener_security of its security protocol)."""
        self._credential = credential_metadata(broker_secret)
        self._tls = grpc_peer_credentials(security)
        self._lock = threading.Lock()
        self._stubs: dict[str, tuple[grpc.Channel, ipb_grpc.TxnMarkersStub]] = {}

    def write_txn_markers(self, target: str, markers: list[TxnMarker], *,
                          timeout_ms: int) -> MarkerOutcomes:
        """Have the broker at `target` append `markers` to the partitions it leads."""
        request = ipb.WriteTxnMarkersRequest(timeout_ms=timeout_ms, markers=[
            ipb.TxnMarker(producer_id=m.producer_id, producer_epoch=m.producer_epoch,
                          committed=m.committed, coordinator_epoch=m.coordinator_epoch,
                          partitions=[ipb.TxnMarkerPartition(topic=t, partition=p)
                                      for t, p in m.partitions])
            for m in markers])
        sent = [(m.producer_id, t, p) for m in markers for t, p in m.partitions]
        try:
            response = self._stub(target).WriteTxnMarkers(
                request, timeout=(timeout_ms + REQUEST_GRACE_MS) / 1000,
                metadata=self._credential)
        except grpc.RpcError as e:
            error = error_from_rpc(e)
            return {key: error for key in sent}
        out: MarkerOutcomes = {
            (r.producer_id, r.topic, r.partition):
                errors.error_for_code(r.error_code, r.error_message) if r.error_code else None
            for r in response.results}
        for key in sent:  # never silently unanswered
            out.setdefault(key, errors.UnknownServerError(f"no answer for the marker {key}"))
        return out

    def close(self) -> None:
        with self._lock:
            for channel, _ in self._stubs.values():
                channel.close()
            self._stubs.clear()

    def _stub(self, target: str) -> ipb_grpc.TxnMarkersStub:
        with self._lock:
            entry = self._stubs.get(target)
            if entry is None:
                channel = open_channel(target, "deltabus-txn-coordinator", credentials=self._tls)
                entry = self._stubs[target] = (channel, ipb_grpc.TxnMarkersStub(channel))
            return entry[1]


def write_txn_markers(target: str, markers: list[TxnMarker], *, timeout_ms: int,
                      broker_secret: str, security: ListenerSecurity = PLAINTEXT
                      ) -> MarkerOutcomes:
    """One WriteTxnMarkers call on a channel of its own (`TxnMarkerClient` keeps channels)."""
    client = TxnMarkerClient(broker_secret=broker_secret, security=security)
    try:
        return client.write_txn_markers(target, markers, timeout_ms=timeout_ms)
    finally:
        client.close()
