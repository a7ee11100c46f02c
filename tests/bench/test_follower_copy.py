"""bench/follower_copy.py: a follower's copy of a leader's small files on moto's S3 server costs
two requests a file (the server-side copy and one GET reading it back whole), where it took
five (a HEAD each side and ranged GETs), and the figures come out of the run (no Spark)."""

from __future__ import annotations

from bench import follower_copy


def test_a_copied_file_costs_a_copy_and_one_read() -> None:
    figures = follower_copy.measure(files=12, rounds=1)
    assert figures["files"] == 12 and figures["ms_per_file"] > 0
    per_file = figures["requests_per_file"]
    # the round's one commit adds a PUT, 1/12 of a request a file
    assert per_file == {"PUT": 1 + 1 / 12, "GET": 1.0}, per_file
