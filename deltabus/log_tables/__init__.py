"""Partition logs as Delta tables (delta-rs): append with group commit, read offset ranges."""

from deltabus.log_tables.partition_log import AppendResult, LogConfig, PartitionLog

__all__ = ["AppendResult", "LogConfig", "PartitionLog"]
