"""The Spark source's options are checked on the driver before a query starts: a bad value gets
a deltabus error naming the option, never a bare Python exception. No SparkSession needed."""

from __future__ import annotations

import pytest

from deltabus import errors
from deltabus.spark import DataLossError
from deltabus.spark.source import SourceOptions

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9192", "subscribe": "payments"}


@pytest.mark.parametrize(("option", "value"), [
    ("startingTimestamp", "yesterday"),
    ("startingTimestamp", "1.5e12"),
    ("maxOffsetsPerTrigger", "many"),
    ("minPartitions", "-1"),
    ("startingOffsets", "{not json"),
    ("startingOffsetsByTimestamp", "[1, 2]"),
    ("kafka.isolation.level", "serializable"),
])
def test_a_bad_option_value_is_an_invalid_config_naming_it(option: str, value: str) -> None:
    with pytest.raises(errors.InvalidConfigError) as info:
        SourceOptions.parse({**BASE, option: value}, streaming=True)
    assert option.lower() in str(info.value).lower()
    assert value in str(info.value)


def test_a_good_starting_timestamp_is_taken_in_milliseconds() -> None:
    options = SourceOptions.parse({**BASE, "startingTimestamp": "1700000000000"}, streaming=True)
    assert options.starting_timestamp == 1_700_000_000_000


def test_data_loss_is_in_the_error_tree() -> None:
    """A query failing on lost data raises a DeltaBusError, so `except DeltaBusError` catches
    every failure deltabus raises."""
    assert issubclass(DataLossError, errors.ClientError)
    assert issubclass(DataLossError, errors.DeltaBusError)
    assert DataLossError is errors.DataLossError
