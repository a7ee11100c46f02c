"""Producer ids (KRaft's ProducerIdControlManager). Runs in the driver, inside the controller.

Ids are reserved in blocks of `PRODUCER_ID_BLOCK` by a producer ids record, so a restarted
controller (which starts handing out from the end of the last block) never hands out an id twice;
within a block the controller counts ids in memory, with no record. A transactional id gets a
producer id once, in a record, and the same one ever after.

Invariants: every id handed out is below the replayed `producer_ids_end`; the controller's next id
only grows. `init_producer_id` is a handler: it returns records and the answer, changing nothing.
Not thread-safe: the controller holds its lock around every call.
"""

from __future__ import annotations

from deltabus.cluster.metadata_records import (
    ControllerResult,
    MetadataRecord,
    ProducerIdsRecord,
    TransactionalIdRecord,
)
from deltabus.cluster.metadata_state import MetadataState

PRODUCER_ID_BLOCK = 1000  # producer ids reserved per metadata record


def init_producer_id(state: MetadataState, next_producer_id: int,
                     transactional_id: str = "") -> ControllerResult[tuple[int, int]]:
    """Kafka's InitProducerId: a new producer id (epoch 0), or for a transactional id the one it
    always has. `next_producer_id` is the next id of the current block; the answer is
    (producer id, epoch), and the controller's next id is past it once the records commit."""
    if transactional_id:
        known = state.transactional_ids.get(transactional_id)
        if known is not None:
            return ControllerResult([], (known, 0))
    records: list[MetadataRecord] = []
    producer_id = next_producer_id
    if producer_id >= state.producer_ids_end:
        records.append(ProducerIdsRecord(producer_id + PRODUCER_ID_BLOCK))
    if transactional_id:
        records.append(TransactionalIdRecord(transactional_id, producer_id))
    return ControllerResult(records, (producer_id, 0))
