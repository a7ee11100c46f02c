"""Client quota enforcement at both doors (Kafka's ClientQuotaManager calls in KafkaApis): what a
request costs is recorded against the quota that applies to its user and client id
(`quotas.ClientQuotaManager`), and the answer says how long to wait (`throttle_time_ms`).

What is recorded, as Kafka records it:
- Produce: the bytes of the record batches the request carries (producer_byte_rate), recorded
  after they were appended: a throttled produce is still written;
- Fetch: the bytes of records the answer would carry (consumer_byte_rate); a throttled fetch is
  answered without records and its bytes do not count, so the consumer fetches the same offsets
  again after the wait (Kafka's getThrottledResponse);
- the handler thread's time (CPU time on the thread that answered it, waits excluded), as a
  percentage of one thread (request_percentage): on the Kafka door every request but
  ApiVersions and SASL, on the gRPC door Produce and Fetch.
The answer carries the largest of the throttle times. The Kafka door then mutes the connection
for that long (KIP-219: `network.Processor` reads nothing from it meanwhile; an acks=0 Produce's
connection too, without an answer), and the gRPC door
holds the next Produce or Fetch of the same user and client id that comes sooner, so a client
that does not wait as told is held all the same.

The user a quota names is the principal's name (User:alice: "alice"; ANONYMOUS on listeners
without authentication, as in Kafka).
"""

from __future__ import annotations

import dataclasses
import time
from datetime import timedelta
from typing import Any

from deltabus.cluster.handler import DeltaBusHandler
from deltabus.quotas import REQUEST_PERCENTAGE, thread_time_percentage
from deltabus.rpc.access import Access


def record(handler: DeltaBusHandler, key: str, access: Access, value: float, *,
           unrecord_if_throttled: bool = False) -> int:
    """Record `value` against the caller's quota for `key`; the throttle time in ms."""
    return handler.client_quota_manager().record(
        key, access.principal.name, access.client_id, value,
        unrecord_if_throttled=unrecord_if_throttled)


def record_thread_time(handler: DeltaBusHandler, access: Access, started_s: float) -> int:
    """Record the handler thread's time since `started_s` (time.thread_time()) against the
    caller's request_percentage; the throttle time in ms."""
    spent_s = max(0.0, time.thread_time() - started_s)
    return record(handler, REQUEST_PERCENTAGE, access, thread_time_percentage(spent_s))


def held_ms(handler: DeltaBusHandler, access: Access) -> int:
    """What is left of the throttle the caller was last given (0: none)."""
    return handler.client_quota_manager().throttled_ms(access.principal.name, access.client_id)


def with_throttle_time(response: Any, throttle_ms: int) -> Any:
    """A kio response with its throttle_time set to `throttle_ms` when that is longer."""
    current = getattr(response, "throttle_time", None)
    if throttle_ms <= 0 or not isinstance(current, timedelta):
        return response
    if current >= timedelta(milliseconds=throttle_ms):
        return response
    return dataclasses.replace(response, throttle_time=timedelta(milliseconds=throttle_ms))


def throttle_time_ms(response: Any) -> int:
    """A kio response's throttle_time in ms (0: none, or no such field)."""
    current = getattr(response, "throttle_time", None)
    return int(current.total_seconds() * 1000) if isinstance(current, timedelta) else 0
