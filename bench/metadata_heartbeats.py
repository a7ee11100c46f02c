"""The bytes of a broker's heartbeat answer after a one-partition ISR change (issue 17).

`python -m bench.metadata_heartbeats [--partitions N]`: a controller (no Spark: the driver's
controller with its real metadata log and replica tables under a temporary directory) with three
registered brokers and N partitions (topics of 100, replication factor 3); one partition's
leader shrinks its ISR, and the figure is the size of the heartbeat answer a broker current
with the version before gets, as the controller's gRPC servicer encodes it (the bytes on the
wire, less gRPC's 5-byte frame). Also what a new broker gets: every answer until it holds the
whole metadata, and what gzip makes of the answers the servicer compresses. Run against a
deltabus from before heartbeats carried deltas, it measures the whole image those carried (the
request then has no metadata position; the script asks for one only where the protocol has
it).
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from deltabus import config as cfg
from deltabus.cluster.controller import Controller
from deltabus.metadata import BrokerEndpoint, NewTopic
from deltabus.rpc.internal_servicer import BrokerLifecycleServicer
from deltabus.rpc.v1 import internal_pb2 as ipb

PARTITIONS_PER_TOPIC = 100
BROKERS = 3
NEW_BROKER_ANSWERS_MAX = 1_000  # a bound on the loop that follows a new broker's answers
# Answers the servicer has gRPC gzip (cfg.METADATA_FETCH_COMPRESS_BYTES_MIN, where it is).
COMPRESS_BYTES_MIN = getattr(cfg, "METADATA_FETCH_COMPRESS_BYTES_MIN", 1 << 62)


def _request(broker: int, epoch: int, version: int, position: tuple[int, int, bool]
             ) -> ipb.BrokerHeartbeatRequest:
    request = ipb.BrokerHeartbeatRequest(broker_id=broker, broker_epoch=epoch,
                                         metadata_version=version, max_wait_ms=0)
    if "metadata_position" in ipb.BrokerHeartbeatRequest.DESCRIPTOR.fields_by_name:
        p = request.metadata_position  # type: ignore[attr-defined]
        p.version, p.index, p.snapshot = position
    return request


def _end(response: ipb.BrokerHeartbeatResponse, version: int) -> tuple[tuple[int, int, bool],
                                                                       int]:
    """Where a broker is after this answer, and the version it then serves."""
    if "metadata_records" not in ipb.BrokerHeartbeatResponse.DESCRIPTOR.fields_by_name:
        served = response.metadata.metadata_version or version  # the whole image
        return (served, 0, False), served
    if not response.HasField("metadata_records"):
        return (version, 0, False), version
    end = response.metadata_records.end  # type: ignore[attr-defined]
    position = (end.version, end.index, end.snapshot)
    return position, (end.version if not end.snapshot and not end.index else version)


def heartbeat_bytes(partitions: int) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="deltabus-bench-heartbeats-")
    try:
        controller = Controller(cfg.ClusterConfig(root=root, brokers=BROKERS, kafka_port=-1,
                                                  port=0))
        servicer = BrokerLifecycleServicer(controller)
        epochs = {b: controller.register_broker(BrokerEndpoint(b, "127.0.0.1", 9000 + b), b)
                  for b in range(BROKERS)}
        for b, epoch in epochs.items():  # caught up: unfenced
            controller.heartbeat(b, epoch, controller.image().version, 0)
        started = time.monotonic()
        topics = [NewTopic(f"t{i}", min(PARTITIONS_PER_TOPIC, partitions - i * 100), BROKERS)
                  for i in range(-(-partitions // PARTITIONS_PER_TOPIC))]
        controller.create_topics(topics, timeout_ms=0)
        create_s = time.monotonic() - started

        image = controller.image()
        state = image.topics["t0"].partitions[0]
        version = image.version
        controller.alter_partition(state.leader, epochs[state.leader], "t0", 0,
                                   state.leader_epoch, list(state.isr),
                                   [r for r in state.isr if r != state.replicas[-1]])
        follower = state.replicas[1]
        started = time.monotonic()
        answer = servicer.BrokerHeartbeat(
            _request(follower, epochs[follower], version, (version, 0, False)), None)
        isr_change_s = time.monotonic() - started

        # A new broker (here: broker 0 again, registered anew): every answer until it is current.
        epoch = controller.register_broker(BrokerEndpoint(0, "127.0.0.1", 9000), 0)
        position, served = (0, 0, False), 0
        sizes: list[int] = []
        gzipped: list[int] = []  # as gRPC sends an answer it compresses
        started = time.monotonic()
        while served < controller.image().version and len(sizes) < NEW_BROKER_ANSWERS_MAX:
            response = servicer.BrokerHeartbeat(_request(0, epoch, served, position), None)
            sizes.append(response.ByteSize())
            gzipped.append(len(gzip.compress(response.SerializeToString()))
                           if sizes[-1] >= COMPRESS_BYTES_MIN else sizes[-1])
            position, served = _end(response, served)
        new_broker_s = time.monotonic() - started
        return {"partitions": sum(t.num_partitions for t in topics), "brokers": BROKERS,
                "replication_factor": BROKERS, "create_topics_s": round(create_s, 2),
                "isr_change_answer_bytes": answer.ByteSize(),
                "isr_change_answer_s": round(isr_change_s, 4),
                "new_broker_answers": len(sizes), "new_broker_bytes": sum(sizes),
                "new_broker_largest_answer_bytes": max(sizes, default=0),
                "new_broker_bytes_sent_gzip": sum(gzipped),
                "new_broker_s": round(new_broker_s, 3)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.metadata_heartbeats",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--partitions", type=int, default=2_000,
                   help="partitions in the cluster (default 2000)")
    args = p.parse_args(argv)
    if args.partitions < 1:
        p.error("--partitions must be at least 1")
    print(json.dumps(heartbeat_bytes(args.partitions), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
