"""A follower whose leader cannot be reached says so once, not every replica.fetch.backoff.ms.

A leader that dies, or is cut off, leaves its followers retrying every 100 ms until the
metadata names a new leader: a line per retry filled the logs of a broker (ten a second per
leader) and buried what mattered. The follower says the first failure of a run at INFO, the
others at DEBUG, and how long the run lasted once fetching works again."""

from __future__ import annotations

import logging
import socket

import pytest

from deltabus import config as cfg
from deltabus.cluster.partition import Partition
from deltabus.cluster.replica_fetcher import ReplicaFetcher
from deltabus.log_tables import LogConfig, PartitionLog
from deltabus.rpc.leader_endpoint import RemoteLeaderEndpoint
from tests.conftest import wait_until

FETCHER_LOG = "deltabus.cluster.replica_fetcher"


def closed_port() -> int:
    """A loopback port nothing listens on: connections to it are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_leader_is_logged_once_per_run_of_failures(
        tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    config = cfg.ClusterConfig(root=str(tmp_path), brokers=2)
    log = PartitionLog(str(tmp_path / "replica"), topic="t", partition=0,
                       config=LogConfig(group_commit_linger_ms=0))
    leaders = RemoteLeaderEndpoint(1, broker_secret=config.inter_broker_secret,
                                   request_timeout_ms=1_000)
    fetcher = ReplicaFetcher(1, 0, leaders, config)
    caplog.set_level(logging.DEBUG, logger=FETCHER_LOG)
    try:
        fetcher.follow(Partition("t", 0, 1, log), leader_epoch=0)
        fetcher.set_address(f"127.0.0.1:{closed_port()}")

        def failures() -> list[logging.LogRecord]:
            return [r for r in caplog.records
                    if r.name == FETCHER_LOG and "failed" in r.getMessage()]

        wait_until(lambda: len(failures()) >= 5, "five failed fetch rounds")
    finally:
        fetcher.stop()
        log.close()
    told = [r for r in failures() if r.levelno >= logging.INFO]
    assert len(told) == 1, [r.getMessage() for r in told]
    assert "fetch from leader 0" in told[0].getMessage()


def test_a_partition_refused_again_and_again_is_logged_once(
        tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    """A leader that no longer leads a partition refuses its copy every backoff until the
    follower learns the new leader: said once, and again only when the error changes."""
    from deltabus import errors
    from deltabus.cluster.replica_fetcher import _Followed

    config = cfg.ClusterConfig(root=str(tmp_path), brokers=2)
    log = PartitionLog(str(tmp_path / "replica"), topic="t", partition=0,
                       config=LogConfig(group_commit_linger_ms=0))
    leaders = RemoteLeaderEndpoint(1, broker_secret=config.inter_broker_secret)
    fetcher = ReplicaFetcher(1, 0, leaders, config)
    caplog.set_level(logging.DEBUG, logger=FETCHER_LOG)
    followed = _Followed(Partition("t", 0, 1, log), leader_epoch=0)
    moved = errors.NotLeaderOrFollowerError("broker 0 is not the leader of t-0 (leader: 2)")
    try:
        for error in (moved, moved, moved, errors.NotLeaderOrFollowerError("leader: 3"), moved):
            fetcher._on_error(followed, error)  # what each refused round does
    finally:
        fetcher.stop()
        log.close()
    told = [r.getMessage() for r in caplog.records
            if r.name == FETCHER_LOG and r.levelno >= logging.INFO]
    assert len(told) == 3 and "leader: 3" in told[1], told
