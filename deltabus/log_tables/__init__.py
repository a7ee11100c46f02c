"""Partition logs as Delta tables (delta-rs): append with group commit, read offset ranges.

Runs on executors (in brokers, and in the log cleaner's and catch-up's Spark tasks). May import
only the pure modules: no transport, no cluster state (tests/test_layering.py).
"""

from deltabus.log_tables.partition_log import (
    AppendResult,
    CommitRange,
    LogConfig,
    PartitionLog,
    commit_ranges,
)

__all__ = ["AppendResult", "CommitRange", "LogConfig", "PartitionLog", "commit_ranges"]
