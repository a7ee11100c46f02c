"""The low-level client every deltabus client shares: bootstrap, one channel per broker, cached
metadata; failed calls become deltabus errors through `deltabus.rpc.status.error_from_rpc`.

Thread-safe. Clients find partition leaders through metadata and refresh it when a response says
the metadata was stale (`invalid_metadata` errors), so a relaunched broker on a new port, or a
leader that moved, is found again without the user noticing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

import grpc

from deltabus import errors
from deltabus.client.security import ClientSecurity
from deltabus.metadata import BrokerEndpoint, MetadataImage, PartitionState, empty_image
from deltabus.rpc import codec
from deltabus.rpc.channel import client_id_metadata, open_channel
from deltabus.rpc.status import error_from_rpc
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc


def parse_bootstrap(servers: str | Iterable[str]) -> list[str]:
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out = [s.strip() for s in items if s.strip()]
    if not out:
        raise errors.ClientError("bootstrap_servers is empty: give host:port[,host:port...]")
    for s in out:
        host, _, port = s.rpartition(":")
        if not host or not port.isdigit():
            raise errors.ClientError(f"bootstrap server {s!r} is not host:port")
    return out


# What a failed connection says when the two ends disagree on TLS, and what to tell the user.
_TLS_MISMATCH = (
    (False, "Socket closed", "the server closed the connection at once: is its listener SSL or "
     "SASL_SSL? then set security.protocol, which is {protocol} here"),
    (True, "WRONG_VERSION_NUMBER", "the server does not answer in TLS: is its listener PLAINTEXT "
     "or SASL_PLAINTEXT? then set security.protocol, which is {protocol} here"),
    (True, "CERTIFICATE_VERIFY_FAILED", "the server's certificate is not signed by the CA of "
     "ssl.ca.location, or without it by the system's roots"),
)


def explained(error: errors.DeltaBusError, security: ClientSecurity) -> errors.DeltaBusError:
    """A connection failure that looks like a security.protocol mismatch, with a hint."""
    if not isinstance(error, errors.NetworkError):
        return error
    for tls, sign, hint in _TLS_MISMATCH:
        if tls == security.uses_tls and sign in error.message:
            return type(error)(
                f"{error.message}; {hint.format(protocol=security.security_protocol)}")
    return error


class ClusterClient:
    """Channels and metadata for one cluster."""

    def __init__(self, bootstrap_servers: str | Iterable[str], *, request_timeout_ms: int = 30_000,
                 retry_backoff_ms: int = 100, metadata_max_age_ms: int = 300_000,
                 client_id: str = "deltabus", security: ClientSecurity | None = None) -> None:
        """`security`: TLS and SASL for every channel (deltabus.client.security); PLAINTEXT
        when None."""
        self.bootstrap = parse_bootstrap(bootstrap_servers)
        self.security = security or ClientSecurity()
        self._credentials = (self.security.channel_credentials() if self.security.uses_tls
                             else None)
        self._call_metadata = (*self.security.call_metadata(), *client_id_metadata(client_id))
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.metadata_max_age_ms = metadata_max_age_ms
        self.client_id = client_id
        self._lock = threading.Lock()
        self._stubs: dict[str, tuple[grpc.Channel, pb_grpc.DeltaBusStub]] = {}
        self._raw_produce: dict[str, Any] = {}
        self._image = empty_image()
        self._image_at = 0.0
        self._closed = False

    # ---- channels ----------------------------------------------------------------------------

    def stub(self, address: str) -> pb_grpc.DeltaBusStub:
        with self._lock:
            if self._closed:
                raise errors.ClientError("the client is closed")
            entry = self._stubs.get(address)
            if entry is None:
                channel = open_channel(address, self.client_id, credentials=self._credentials,
                                       metadata=self._call_metadata)
                entry = (channel, pb_grpc.DeltaBusStub(channel))
                self._stubs[address] = entry
            return entry[1]

    def raw_produce(self, address: str) -> Any:
        """Produce taking already-serialized request bytes (see deltabus.client.wire)."""
        self.stub(address)
        with self._lock:
            method = self._raw_produce.get(address)
            if method is None:
                channel = self._stubs[address][0]
                method = channel.unary_unary(
                    "/deltabus.v1.DeltaBus/Produce",
                    request_serializer=lambda data: data,
                    response_deserializer=pb.ProduceResponse.FromString)
                self._raw_produce[address] = method
            return method

    def call(self, address: str, method: str, request: Any, timeout_ms: int | None = None) -> Any:
        """One RPC to one server; gRPC failures come back as deltabus errors."""
        timeout_s = (timeout_ms or self.request_timeout_ms) / 1000
        try:
            return getattr(self.stub(address), method)(request, timeout=timeout_s)
        except grpc.RpcError as e:
            raise explained(error_from_rpc(e), self.security) from None

    def call_any(self, method: str, request: Any, timeout_ms: int | None = None) -> Any:
        """An RPC any server answers (metadata, admin): bootstrap servers first, then brokers."""
        last: errors.DeltaBusError | None = None
        addresses = self.bootstrap + [b.address for b in self._image.brokers]
        for address in dict.fromkeys(addresses):
            try:
                return self.call(address, method, request, timeout_ms)
            except errors.DeltaBusError as e:
                if not e.retriable:
                    raise
                last = e
        raise last or errors.NetworkError("no bootstrap server answered")

    # ---- metadata ----------------------------------------------------------------------------

    @property
    def image(self) -> MetadataImage:
        return self._image

    def refresh_metadata(self, topics: list[str] | None = None,
                         allow_auto_create: bool = False) -> MetadataImage:
        """Fetch the whole cluster's metadata (Kafka clients fetch only their topics; ours is
        small). With `allow_auto_create`, a first request creates the missing `topics`."""
        if topics:  # named: creates the missing ones if asked, and says which are refused
            named = self.call_any("Metadata", pb.MetadataRequest(
                topics=topics, allow_auto_topic_creation=allow_auto_create))
            for t in named.topics:  # a refusal waiting will not change fails now, as Kafka's
                if t.error_code and not errors.error_for_code(t.error_code).retriable:
                    raise errors.error_for_code(t.error_code, t.error_message)
        response = self.call_any("Metadata", pb.MetadataRequest(allow_auto_topic_creation=False))
        image = codec.image_from_proto(response)
        with self._lock:
            self._image = image
            self._image_at = time.monotonic()
        return image

    def metadata(self, max_age_ms: int | None = None) -> MetadataImage:
        age = (time.monotonic() - self._image_at) * 1000
        if self._image_at == 0 or age > (max_age_ms if max_age_ms is not None
                                         else self.metadata_max_age_ms):
            return self.refresh_metadata()
        return self._image

    def partitions_for(self, topic: str, *, wait_ms: int = 60_000,
                       allow_auto_create: bool = False) -> int:
        """The topic's partition count; refreshes metadata, waits for a new topic to appear."""
        image = self._image
        if topic in image.topics:
            return len(image.topics[topic].partitions)
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            image = self.refresh_metadata([topic], allow_auto_create)
            if topic in image.topics:
                return len(image.topics[topic].partitions)
            if time.monotonic() >= deadline:
                raise errors.UnknownTopicOrPartitionError(
                    f"Topic {topic} not present in metadata after {wait_ms} ms.")
            time.sleep(self.retry_backoff_ms / 1000)

    def leader(self, topic: str, partition: int) -> tuple[BrokerEndpoint, PartitionState]:
        """The leader's endpoint for a partition, from cached metadata (raises when unknown)."""
        image = self._image
        state = image.partition(topic, partition)
        if state is None:
            if topic in image.topics:
                raise errors.UnknownTopicOrPartitionError(
                    f"partition {partition} of topic {topic} does not exist "
                    f"(it has {len(image.topics[topic].partitions)})")
            raise errors.UnknownTopicOrPartitionError(f"Topic '{topic}' does not exist.")
        broker = image.broker(state.leader)
        if broker is None:
            raise errors.LeaderNotAvailableError(
                f"{topic}-{partition} has no live leader right now")
        return broker, state

    def close(self) -> None:
        with self._lock:
            self._closed = True
            stubs, self._stubs = self._stubs, {}
            self._raw_produce = {}
        for channel, _ in stubs.values():
            channel.close()
