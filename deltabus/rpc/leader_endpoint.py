"""A follower's fetches from the brokers leading its partitions (Kafka's RemoteLeaderEndPoint):
`FetchSpec`s in, `FetchResult`s out, over the internal `ReplicaFetch` API, so the replica fetcher
works in domain types. The leader answers a follower up to its log end offset (not the high
watermark), with whole committed files where it can, or where the two logs diverge.

Thread-safe: one channel per leader address, opened on first use.
"""

from __future__ import annotations

import threading

import grpc

from deltabus import errors
from deltabus.cluster.handler import FetchResult, FetchSpec
from deltabus.config import ListenerSecurity
from deltabus.log_tables.partition_log import LogFile
from deltabus.records import from_ipc
from deltabus.rpc.channel import open_channel
from deltabus.rpc.inter_broker import credential_metadata
from deltabus.rpc.status import error_from_rpc
from deltabus.rpc.tls import grpc_peer_credentials
from deltabus.rpc.v1 import internal_pb2 as ipb
from deltabus.rpc.v1 import internal_pb2_grpc as ipb_grpc

PLAINTEXT = ListenerSecurity()


class RemoteLeaderEndpoint:
    """Fetches for one follower broker (`replica_id`) from any leader broker."""

    def __init__(self, replica_id: int, *, broker_secret: str,
                 security: ListenerSecurity = PLAINTEXT,
                 request_timeout_ms: int = 30_000) -> None:
        """`broker_secret`: the cluster's broker credential, which every follower fetch
        carries (`rpc.inter_broker`); `security`: the listeners', TLS where they use it."""
        self.replica_id = replica_id
        self._credential = credential_metadata(broker_secret)
        self._tls = grpc_peer_credentials(security)
        self.request_timeout_ms = request_timeout_ms
        self._lock = threading.Lock()
        self._stubs: dict[str, tuple[grpc.Channel, ipb_grpc.ReplicaFetchStub]] = {}

    def fetch(self, address: str, specs: list[FetchSpec], *, max_wait_ms: int,
              max_bytes: int) -> list[FetchResult]:
        """One follower fetch from the leader at `address`; waits at most `max_wait_ms` for data
        (and the request timeout beyond it). An unreachable leader raises a deltabus error."""
        request = ipb.ReplicaFetchRequest(
            replica_id=self.replica_id, max_wait_ms=max_wait_ms, min_bytes=1,
            max_bytes=max_bytes, partitions=[ipb.ReplicaFetchPartition(
                topic=s.topic, partition=s.partition, fetch_offset=s.offset,
                partition_max_bytes=s.max_bytes, current_leader_epoch=s.current_leader_epoch,
                last_fetched_epoch=s.last_fetched_epoch,
                log_start_offset=s.log_start_offset) for s in specs])
        timeout_s = (max_wait_ms + self.request_timeout_ms) / 1000
        try:
            response = self._stub(address).Fetch(request, timeout=timeout_s,
                                                  metadata=self._credential)
        except grpc.RpcError as e:
            raise error_from_rpc(e) from None
        return [_result_from_proto(r) for r in response.partitions]

    def close(self) -> None:
        with self._lock:
            for channel, _ in self._stubs.values():
                channel.close()
            self._stubs.clear()

    def _stub(self, address: str) -> ipb_grpc.ReplicaFetchStub:
        with self._lock:
            entry = self._stubs.get(address)
            if entry is None:
                channel = open_channel(address, f"deltabus-replica-{self.replica_id}",
                                       credentials=self._tls)
                entry = self._stubs[address] = (channel, ipb_grpc.ReplicaFetchStub(channel))
            return entry[1]


def _result_from_proto(r: ipb.ReplicaFetchPartitionResponse) -> FetchResult:
    return FetchResult(
        r.topic, r.partition,
        error=errors.error_for_code(r.error_code, r.error_message) if r.error_code else None,
        records=from_ipc(r.arrow_records) if r.arrow_records else None,
        high_watermark=r.high_watermark, log_start_offset=r.log_start_offset,
        log_end_offset=r.log_end_offset,
        diverging_epoch=((r.diverging_epoch.epoch, r.diverging_epoch.end_offset)
                         if r.HasField("diverging_epoch") else None),
        files=[LogFile(f.uri, f.size_bytes, f.stats, f.base_offset, f.last_offset)
               for f in r.files] or None)
