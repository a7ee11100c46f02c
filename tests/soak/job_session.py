"""The start every soak job's driver shares (scaling_job.py, dynamic_allocation_job.py): a
stack dump before the test gives up on it, INFO logs, and a SparkSession on `master` bound to
loopback without a UI, with `conf` on top."""

from __future__ import annotations

import faulthandler
import logging
import os

import pyspark
from pyspark.sql import SparkSession


def job_session(master: str, dump_after_s: float, conf: dict[str, str] | None = None
                ) -> SparkSession:
    faulthandler.dump_traceback_later(dump_after_s, exit=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    os.environ.setdefault("SPARK_HOME", os.path.dirname(pyspark.__file__))
    builder = (SparkSession.builder.master(master)
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
