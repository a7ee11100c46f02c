"""Client quotas as Kafka has them (KIP-13, KIP-55, KIP-124, KIP-219, KIP-546): the entities, the
keys, which quota applies to a request, and the rates brokers throttle by.

A quota entity is a user, a client id, or both, each with a name or `None` for the default
(`<default>` in kafka-configs.sh). A request of (user, client id) is held to the quota of the
first entity in Kafka's order that has one for that key (`RESOLUTION_ORDER`):

    /config/users/<user>/clients/<client-id>     /config/users/<default>/clients/<client-id>
    /config/users/<user>/clients/<default>       /config/users/<default>/clients/<default>
    /config/users/<user>                         /config/users/<default>
    /config/clients/<client-id>                  /config/clients/<default>

(read down the left column, then the right). The rate is measured per matched entity with its
defaults filled in by the request's own names, as Kafka's metric tags are: a default user quota
holds every user to it separately, an explicit one holds every client id of that user together.

Rates are Kafka's `Rate` over `quota.window.num` samples of `quota.window.size.seconds`
(`QuotaRate`): the total in the samples kept, over the time they span, never less than
(num - 1) windows, so a new client is not throttled for a quick first burst. A request that takes
the rate over its quota is answered (Kafka's KIP-219) with `throttle_time_ms`: how long until the
rate is back at the quota, `(rate - quota) / quota * window`; the client waits that long, and the
Kafka door mutes the connection for it too, so a client that does not wait is held anyway.

Pure: no I/O. `ClientQuotaManager` is thread-safe (one lock); every other type is frozen.
Invariants: every quota held is a known key with a positive finite value, on a valid entity
(`check_entity`); a manager never holds more than `QUOTA_SENSORS_MAX` rates (the oldest idle one
goes first), so clients inventing client ids cannot grow a broker's memory without bound.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from deltabus import errors

USER, CLIENT_ID, IP = "user", "client-id", "ip"  # Kafka's entity types (ClientQuotaEntity)
PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
QUOTA_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE)
INTEGER_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE)  # Kafka's LONG configs
DEFAULT_NAME = "<default>"  # how kafka-configs.sh and ZooKeeper-era Kafka name a default

# Kafka's broker configs for the rate windows (quota.window.num, quota.window.size.seconds).
QUOTA_WINDOW_NUM = 11
QUOTA_WINDOW_SIZE_SECONDS = 1
# A throttle is at most the whole window: past it the samples that caused it are gone anyway.
THROTTLE_TIME_MS_MAX = QUOTA_WINDOW_NUM * QUOTA_WINDOW_SIZE_SECONDS * 1000
QUOTA_SENSORS_MAX = 100_000  # rates a broker keeps (one per quota'd user / client id seen)
QUOTA_ALTERATIONS_PER_REQUEST_MAX = 10_000  # entries of one AlterClientQuotas
QUOTA_NAME_CHARS_MAX = 1_024  # a user or client id in a quota entity
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2  # DescribeClientQuotas' match types


@dataclass(frozen=True)
class QuotaEntity:
    """A quota entity (Kafka's ClientQuotaEntity): (entity type, name or None for the
    default) pairs, sorted by type, each type once."""

    entries: tuple[tuple[str, str | None], ...]

    @classmethod
    def of(cls, entries: Mapping[str, str | None] | Iterable[tuple[str, str | None]]
           ) -> QuotaEntity:
        pairs = list(entries.items()) if isinstance(entries, Mapping) else list(entries)
        types = [t for t, _ in pairs]
        if len(set(types)) != len(types):
            raise errors.InvalidRequestError(
                f"Invalid quota entity: an entity type appears twice in {types}")
        return cls(tuple(sorted(pairs, key=lambda p: p[0])))

    @classmethod
    def user(cls, name: str | None) -> QuotaEntity:
        return cls(((USER, name),))

    @classmethod
    def client(cls, name: str | None) -> QuotaEntity:
        return cls(((CLIENT_ID, name),))

    @classmethod
    def user_client(cls, user: str | None, client_id: str | None) -> QuotaEntity:
        return cls(((CLIENT_ID, client_id), (USER, user)))

    def sort_key(self) -> tuple[tuple[str, bool, str], ...]:
        """Types, then defaults before names, then names: a listing's order."""
        return tuple((t, n is not None, n or "") for t, n in self.entries)

    def as_dict(self) -> dict[str, str | None]:
        return dict(self.entries)

    def __str__(self) -> str:
        return ", ".join(f"{t}={DEFAULT_NAME if n is None else n}" for t, n in self.entries)


def check_entity(entity: QuotaEntity) -> None:
    """Kafka's checks of an entity to alter (INVALID_REQUEST): user, client-id or both. IP
    quotas (KIP-612's connection_creation_rate) are not kept by deltabus."""
    types = {t for t, _ in entity.entries}
    if not types:
        raise errors.InvalidRequestError("Invalid empty client quota entity")
    unknown = types - {USER, CLIENT_ID}
    if unknown:
        what = ("IP quotas (connection_creation_rate) are not supported by deltabus"
                if unknown == {IP} else f"Unhandled client quota entity type: {sorted(unknown)[0]}")
        raise errors.InvalidRequestError(what)
    for t, name in entity.entries:
        if name is not None and not name:
            raise errors.InvalidRequestError(f"Invalid empty {t} name: use the default entity")
        if name is not None and len(name) > QUOTA_NAME_CHARS_MAX:
            raise errors.InvalidRequestError(
                f"The {t} name is {len(name)} characters, over {QUOTA_NAME_CHARS_MAX}")


def check_value(key: str, value: float) -> None:
    """Kafka's checks of one quota value (INVALID_REQUEST): a known key, a positive finite
    number, whole for the byte rates (Kafka's LONG configs)."""
    if key not in QUOTA_KEYS:
        raise errors.InvalidRequestError(
            f"Invalid configuration key {key}: use one of {', '.join(QUOTA_KEYS)}")
    if not math.isfinite(value) or value <= 0:
        raise errors.InvalidRequestError(
            f"Config value for key {key} must be a positive number, not {value}")
    if key in INTEGER_KEYS and value != int(value):
        raise errors.InvalidRequestError(f"Config value for key '{key}' must be an integer")


@dataclass(frozen=True)
class QuotaAlteration:
    """One entry of AlterClientQuotas: for each key a value to set, or None to remove it."""

    entity: QuotaEntity
    ops: tuple[tuple[str, float | None], ...]


@dataclass(frozen=True)
class QuotaFilterComponent:
    """One component of DescribeClientQuotas' filter: an entity type and how to match its
    name (MATCH_EXACT `match`, MATCH_DEFAULT, or MATCH_SPECIFIED: any name, default or not)."""

    entity_type: str
    match_type: int = MATCH_SPECIFIED
    match: str | None = None


ClientQuotas = Mapping[QuotaEntity, Mapping[str, float]]


def describe_client_quotas(quotas: ClientQuotas, components: Iterable[QuotaFilterComponent],
                           strict: bool = False) -> dict[QuotaEntity, dict[str, float]]:
    """Kafka's DescribeClientQuotas over a set of quotas: the entities every component matches
    (strict: and no entity type the filter does not name). INVALID_REQUEST for a bad filter."""
    wanted = list(components)
    types = [c.entity_type for c in wanted]
    if len(set(types)) != len(types):
        raise errors.InvalidRequestError(f"Duplicate entity type in the filter: {types}")
    for c in wanted:
        if c.match_type not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED):
            raise errors.InvalidRequestError(f"Unknown match type {c.match_type}")
        if c.match_type == MATCH_EXACT and c.match is None:
            raise errors.InvalidRequestError(
                f"A null match for entity type {c.entity_type} is only valid with MATCH_DEFAULT")
        if c.entity_type not in (USER, CLIENT_ID, IP):
            raise errors.InvalidRequestError(f"Custom entity type '{c.entity_type}' is not "
                                             "supported")
    out = {}
    for entity, values in sorted(quotas.items(), key=lambda item: item[0].sort_key()):
        names = entity.as_dict()
        if strict and set(names) != set(types):
            continue
        if all(_matches(c, names) for c in wanted) and values:
            out[entity] = dict(values)
    return out


def _matches(c: QuotaFilterComponent, names: Mapping[str, str | None]) -> bool:
    if c.entity_type not in names:
        return False
    name = names[c.entity_type]
    if c.match_type == MATCH_EXACT:
        return name == c.match
    if c.match_type == MATCH_DEFAULT:
        return name is None
    return True


# ---- which quota applies -----------------------------------------------------------------------

# Kafka's order (DefaultQuotaCallback): (user, client id) parts of the entity, "name" meaning the
# request's own, None the default; "-" that the entity has no such part.
_NAME, _DEFAULT, _NONE = "name", None, "-"
RESOLUTION_ORDER: tuple[tuple[str | None, str | None], ...] = (
    (_NAME, _NAME), (_NAME, _DEFAULT), (_NAME, _NONE),
    (_DEFAULT, _NAME), (_DEFAULT, _DEFAULT), (_DEFAULT, _NONE),
    (_NONE, _NAME), (_NONE, _DEFAULT),
)


def _entity(user: str, client_id: str, shape: tuple[str | None, str | None]) -> QuotaEntity:
    pairs: list[tuple[str, str | None]] = []
    for kind, part, name in ((USER, shape[0], user), (CLIENT_ID, shape[1], client_id)):
        if part != _NONE:
            pairs.append((kind, name if part == _NAME else None))
    return QuotaEntity.of(pairs)


@dataclass(frozen=True)
class ResolvedQuota:
    """The quota a request is held to: the entity that set it, its value, and the key its
    rate is measured under (the entity with the request's names for its defaults)."""

    entity: QuotaEntity
    bound: float
    sensor: tuple[str, str, str]  # (quota key, user or "", client id or "")


def resolve_quota(quotas: ClientQuotas, key: str, user: str,
                  client_id: str) -> ResolvedQuota | None:
    """The quota for `key` a request of (user, client id) is held to, in Kafka's order; None:
    no entity sets one, so the request is not held to any."""
    for shape in RESOLUTION_ORDER:
        entity = _entity(user, client_id, shape)
        bound = quotas.get(entity, {}).get(key)
        if bound is not None:
            return ResolvedQuota(entity, bound, (key, user if shape[0] != _NONE else "",
                                                 client_id if shape[1] != _NONE else ""))
    return None


# ---- rates ---------------------------------------------------------------------------------------

class QuotaRate:
    """Kafka's `Rate` over `samples` windows of `window_s` seconds (SampledStat). Not
    thread-safe: the manager's lock guards it."""

    __slots__ = ("_samples", "_window_s", "_starts", "_totals", "last_used_s")

    def __init__(self, samples: int = QUOTA_WINDOW_NUM,
                 window_s: float = QUOTA_WINDOW_SIZE_SECONDS) -> None:
        self._samples = samples
        self._window_s = window_s
        self._starts: list[float] = []
        self._totals: list[float] = []
        self.last_used_s = 0.0

    def record(self, value: float, now_s: float) -> None:
        self._purge(now_s)
        if not self._starts or now_s - self._starts[-1] >= self._window_s:
            self._starts.append(now_s)
            self._totals.append(0.0)
            if len(self._starts) > self._samples:
                del self._starts[0], self._totals[0]
        self._totals[-1] += value
        self.last_used_s = now_s

    def unrecord(self, value: float, now_s: float) -> None:
        """Take back what `record` just added (a throttled Fetch's bytes: it sends none)."""
        if self._totals:
            self._totals[-1] -= value

    def _purge(self, now_s: float) -> None:
        horizon = self._samples * self._window_s
        while self._starts and now_s - self._starts[0] >= horizon:
            del self._starts[0], self._totals[0]

    def window_s(self, now_s: float) -> float:
        """The time the rate is taken over: since the oldest sample, at least samples - 1
        whole windows (Kafka's Rate.windowSize)."""
        self._purge(now_s)
        elapsed = now_s - self._starts[0] if self._starts else 0.0
        full = int(elapsed / self._window_s)
        if full < self._samples - 1:
            elapsed += (self._samples - 1 - full) * self._window_s
        return elapsed

    def measure(self, now_s: float) -> float:
        """Units per second over the samples kept (the expired ones dropped first)."""
        window_s = self.window_s(now_s)
        return sum(self._totals) / window_s


def throttle_time_ms(rate: float, bound: float, window_s: float) -> int:
    """How long until a rate above `bound` is back at it (Kafka's QuotaUtils.throttleTime),
    at most THROTTLE_TIME_MS_MAX; 0 when it is not above."""
    if rate <= bound:
        return 0
    return min(round((rate - bound) / bound * window_s * 1000), THROTTLE_TIME_MS_MAX)


def thread_time_percentage(thread_time_s: float) -> float:
    """A request's handler thread time as request_percentage counts it: % of one thread over
    one second (Kafka's nanosToPercentage), so a rate of 100 is one thread busy all the time."""
    return thread_time_s * 100.0


class ClientQuotaManager:
    """A broker's quotas (from its metadata) and the rates it measures against them: Kafka's
    ClientQuotaManager for produce, fetch and request, in one. Thread-safe."""

    def __init__(self, samples: int = QUOTA_WINDOW_NUM,
                 window_s: float = QUOTA_WINDOW_SIZE_SECONDS,
                 sensors_max: int = QUOTA_SENSORS_MAX) -> None:
        self._samples = samples
        self._window_s = window_s
        self._sensors_max = sensors_max
        self._lock = threading.Lock()
        self._quotas: ClientQuotas = {}
        self._rates: OrderedDict[tuple[str, str, str], QuotaRate] = OrderedDict()
        # (user, client id) -> monotonic time until which its requests are throttled
        self._throttled_until: dict[tuple[str, str], float] = {}

    def update(self, quotas: ClientQuotas) -> None:
        """New quotas (from the metadata): rates of entities that changed start again."""
        with self._lock:
            if quotas == self._quotas:
                return
            self._quotas = quotas
            self._rates.clear()
            self._throttled_until.clear()

    @property
    def quotas(self) -> ClientQuotas:
        return self._quotas

    def record(self, key: str, user: str, client_id: str, value: float,
               now_s: float | None = None, *, unrecord_if_throttled: bool = False) -> int:
        """Record `value` (bytes, or thread time as a percentage) against the quota of `key`
        that applies to (user, client id); the throttle time in ms (0: within its quota, or
        none applies). `unrecord_if_throttled`: a throttled request does not count (a Fetch
        answered without its records, as Kafka's)."""
        quotas = self._quotas
        if not quotas:
            return 0
        resolved = resolve_quota(quotas, key, user, client_id)
        if resolved is None:
            return 0
        now_s = time.monotonic() if now_s is None else now_s
        with self._lock:
            rate = self._rate(resolved.sensor)
            rate.record(value, now_s)
            throttle_ms = throttle_time_ms(rate.measure(now_s), resolved.bound,
                                           rate.window_s(now_s))
            if throttle_ms and unrecord_if_throttled:
                rate.unrecord(value, now_s)
            if throttle_ms:
                until = now_s + throttle_ms / 1000
                who = (user, client_id)
                if len(self._throttled_until) >= self._sensors_max:
                    self._throttled_until = {w: u for w, u in self._throttled_until.items()
                                             if u > now_s}
                self._throttled_until[who] = max(until, self._throttled_until.get(who, 0.0))
            return throttle_ms

    def throttled_ms(self, user: str, client_id: str, now_s: float | None = None) -> int:
        """What is left of the last throttle given to (user, client id): a client that sends
        before it ends (not waiting as told) is held that long first."""
        if not self._throttled_until:
            return 0
        now_s = time.monotonic() if now_s is None else now_s
        with self._lock:
            until = self._throttled_until.get((user, client_id), 0.0)
            if until <= now_s:
                self._throttled_until.pop((user, client_id), None)
                return 0
            return math.ceil((until - now_s) * 1000)

    def _rate(self, sensor: tuple[str, str, str]) -> QuotaRate:
        rate = self._rates.get(sensor)
        if rate is None:
            while len(self._rates) >= self._sensors_max:
                self._rates.popitem(last=False)
            rate = self._rates[sensor] = QuotaRate(self._samples, self._window_s)
        else:
            self._rates.move_to_end(sensor)
        return rate
