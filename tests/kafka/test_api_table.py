"""The table of Kafka APIs (docs/kafka-compatibility.md) is what the Kafka door serves: every API
key Kafka has (as kio knows them) has a row, and its versions are the ones ApiVersions
advertises, so users can trust the table and a change to the door cannot leave it behind."""

from __future__ import annotations

import re
from pathlib import Path

from kio.schema.index import api_key_map

from deltabus.rpc.kafka.apis import SUPPORTED

PAGE = Path(__file__).resolve().parents[2] / "docs" / "kafka-compatibility.md"
ROW = re.compile(r"^\| (\d+) \| (\w+) \| ([-\d]+) \| (.*) \|$")


def table() -> dict[int, tuple[str, str, str]]:
    rows = {}
    for line in PAGE.read_text().splitlines():
        match = ROW.match(line)
        if match:
            key, name, versions, tested = match.groups()
            rows[int(key)] = (name, versions, tested)
    return rows


def test_every_kafka_api_has_a_row_with_the_versions_the_door_serves() -> None:
    rows = table()
    assert sorted(rows) == sorted(api_key_map)
    for key, (name, versions, tested) in rows.items():
        assert name.lower() == api_key_map[key].replace("_", ""), key
        if key in SUPPORTED:
            lo, hi = SUPPORTED[key]
            assert versions == (f"{lo}-{hi}" if lo != hi else f"{lo}"), name
            assert tested, f"{name}: served, and the table names no client tested with it"
        else:
            assert versions == "-", f"{name} is not served, yet the table gives versions"
            assert tested, f"{name}: the table says nothing of why it is not served"
