"""Producer ids (KRaft's ProducerIdControlManager). Runs in the driver, inside the controller.

Ids are reserved in blocks of `PRODUCER_ID_BLOCK` by a producer ids record, so a restarted
controller (which starts handing out from the end of the last block) never hands out an id twice;
within a block the controller counts ids in memory (`ProducerIdControlManager`), with no
record. A transactional id gets a producer id once, in a record, and the same one ever after.

Invariants: every id handed out is below the replayed `producer_ids_end`; the controller's next id
(`ProducerIdControlManager`, the one thing here that changes) only grows; no transactional id
longer than `config.TRANSACTIONAL_ID_LENGTH_MAX` is written.
`init_producer_id` is a handler: it returns records and the answer, changing nothing.
Not thread-safe: the controller holds its lock around every call.
"""

from __future__ import annotations

import hashlib
import hmac

from deltabus import config as cfg
from deltabus.cluster.metadata_records import (
    ControllerResult,
    MetadataRecord,
    ProducerIdsRecord,
    TransactionalIdRecord,
)
from deltabus.cluster.metadata_state import MetadataState
from deltabus.security.principal import ANONYMOUS, KafkaPrincipal

PRODUCER_ID_BLOCK = 1000  # producer ids reserved per metadata record
# With an authorizer, a producer id is (counter << TAG_BITS) | tag, the tag an HMAC of the
# counter and the principal under the cluster's producer id key: a broker checks that a batch's
# producer id was issued to the principal sending it, with no lookup, and nobody can make a valid
# id for another principal, nor guess another producer's (one chance in 2^TAG_BITS).
TAG_BITS = 22


def _tag(key: bytes, counter: int, principal: KafkaPrincipal) -> int:
    digest = hmac.new(key, f"{counter}:{principal}".encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:4], "big") & ((1 << TAG_BITS) - 1)


def bind(counter: int, principal: KafkaPrincipal, key: bytes) -> int:
    """The producer id of `counter` for `principal`."""
    return (counter << TAG_BITS) | _tag(key, counter, principal)


def issued_to(producer_id: int, principal: KafkaPrincipal, key: bytes) -> bool:
    """Whether `producer_id` was issued (`bind`) to `principal`."""
    if producer_id < 0 or not key:
        return False
    counter = producer_id >> TAG_BITS
    return hmac.compare_digest(producer_id.to_bytes(8, "big"),
                               bind(counter, principal, key).to_bytes(8, "big"))


def init_producer_id(state: MetadataState, next_producer_id: int,
                     transactional_id: str = "", *, principal: KafkaPrincipal = ANONYMOUS,
                     bound: bool = False) -> ControllerResult[tuple[int, int]]:
    """Kafka's InitProducerId: a new producer id (epoch 0), or for a transactional id the one it
    always has. `next_producer_id` is the next id of the current block; the answer is
    (producer id, epoch), and the controller's next id is past it once the records commit.
    `bound` (a cluster with an authorizer): the id is bound to `principal` (`bind`), the
    counter being what the records keep; a transactional id then gives each principal its own
    id, the same every time."""
    cfg.check_transactional_id(transactional_id)  # kept for ever: refused before anything

    def answer(counter: int) -> int:
        return bind(counter, principal, state.producer_id_key) if bound else counter

    if transactional_id:
        known = state.transactional_ids.get(transactional_id)
        if known is not None:
            return ControllerResult([], (answer(known), 0))
    records: list[MetadataRecord] = []
    producer_id = next_producer_id
    if producer_id >= state.producer_ids_end:
        records.append(ProducerIdsRecord(producer_id + PRODUCER_ID_BLOCK))
    if transactional_id:
        records.append(TransactionalIdRecord(transactional_id, producer_id))
    return ControllerResult(records, (answer(producer_id), 0))


class ProducerIdControlManager:
    """The next producer id the controller hands out (KRaft's ProducerIdControlManager keeps
    the next block's start). Runs in the driver; not thread-safe: the controller's lock is held
    around every call."""

    def __init__(self, config: cfg.ClusterConfig, state: MetadataState) -> None:
        self._config = config
        self.next_producer_id = state.producer_ids_end  # skip a block used before

    def issued(self, producer_id: int) -> None:
        """Lock held. `producer_id` was handed out: the next id is past its counter."""
        bound = self._config.authorizer
        counter = producer_id >> TAG_BITS if bound else producer_id
        self.next_producer_id = max(self.next_producer_id, counter + 1)
