"""bench/metadata_heartbeats.py keeps working (no Spark: a controller in this process), with a
tiny cluster: its figures, not their sizes, are what this checks."""

from __future__ import annotations

import pytest

from bench.metadata_heartbeats import heartbeat_bytes, main


def test_an_isr_change_answer_is_one_record_and_a_new_broker_gets_a_snapshot() -> None:
    figures = heartbeat_bytes(150)
    assert figures["partitions"] == 150 and figures["replication_factor"] == 3
    assert 0 < figures["isr_change_answer_bytes"] < 200  # one partition change record
    assert figures["new_broker_answers"] == 1  # 150 partitions: one answer holds them
    assert figures["new_broker_bytes"] == figures["new_broker_largest_answer_bytes"]
    # Past METADATA_FETCH_COMPRESS_BYTES_MIN: counted as gRPC sends it, gzip-compressed.
    assert figures["new_broker_bytes_sent_gzip"] < figures["new_broker_bytes"] / 4


def test_partitions_below_one_are_refused() -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--partitions", "0"])
    assert exited.value.code == 2
