"""Partition logs as Delta tables (delta-rs): append with group commit, read offset ranges."""

from deltabus.log_tables.partition_log import (
    AppendResult,
    CommitRange,
    LogConfig,
    PartitionLog,
    commit_ranges,
)

__all__ = ["AppendResult", "CommitRange", "LogConfig", "PartitionLog", "commit_ranges"]
