"""Client tests against `FakeCluster`: real gRPC on loopback, in-memory brokers, no Spark."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.client.fake_cluster import FakeCluster


@pytest.fixture
def fake() -> Iterator[FakeCluster]:
    """A fresh two-broker fake cluster per test (starting one takes milliseconds)."""
    cluster = FakeCluster(brokers=2)
    yield cluster
    cluster.close()
