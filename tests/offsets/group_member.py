"""A consumer-group member in its own process, for tests: joins `group` on `topic`, and prints
one JSON line per event on stdout: {"assigned": [[topic, partition], ...]} after each rebalance,
{"record": [partition, offset, value]} per record it processes. It commits after processing
(at-least-once) every `commit_every` records, and on SIGTERM closes the consumer (leaving the
group at once). SIGKILL is a crash: nothing more is committed.

    python group_member.py BOOTSTRAP TOPIC GROUP [commit_every]
"""

from __future__ import annotations

import json
import logging
import signal
import sys

from deltabus import Consumer
from deltabus.client.consumer import ConsumerRebalanceListener


def emit(event: dict) -> None:
    print(json.dumps(event), flush=True)


class Listener(ConsumerRebalanceListener):
    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer

    def on_partitions_assigned(self, assigned: list) -> None:
        emit({"assigned": sorted(self.consumer.assignment())})


def main(bootstrap: str, topic: str, group: str, commit_every: int) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    consumer = Consumer(bootstrap, group_id=group, auto_offset_reset="earliest",
                        enable_auto_commit=False, session_timeout_ms=3000,
                        heartbeat_interval_ms=300, client_id=f"member-{group}")
    consumer.subscribe([topic], listener=Listener(consumer))
    processed = 0
    while not stopping:
        records = consumer.poll(200)
        for r in records:
            emit({"record": [r.partition, r.offset, r.value.decode()]})
        processed += len(records)
        if records and processed >= commit_every:
            consumer.commit()
            processed = 0
    consumer.close()
    emit({"closed": True})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 1)
