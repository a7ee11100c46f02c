"""`deltabus cluster start`: run a cluster in the foreground, as kafka-server-start.sh does
(`deltabus cluster scale` and `balance` are in cluster_scale.py).

It owns its SparkSession: it starts Spark, then the cluster, serves until Ctrl-C or SIGTERM, and
stops both in that order, so the brokers flush their logs before Spark takes their tasks away.
The cluster is imported when the command runs, not with the CLI: the client install (no server
extra) runs every other command, and this one says in one line which install it needs.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from deltabus import config as cfg
from deltabus import errors, extras
from deltabus.cli import broker_security, cluster_scale
from deltabus.cli.options import CliError, parse_properties, read_properties, split_host_port
from deltabus.listeners import ListenerBindError
from deltabus.storage import normalize_root

if TYPE_CHECKING:
    from deltabus.cluster.cluster import Cluster

SPARK_LOG_LEVEL = "WARN"


def add_parser(subparsers: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser("cluster", help="run a deltabus cluster")
    commands = p.add_subparsers(dest="cluster_command", metavar="COMMAND", required=True)
    s = commands.add_parser("start", parents=[parent],
                            help="start a cluster and serve until Ctrl-C (kafka-server-start.sh)")
    s.add_argument("--root", default=os.environ.get("DELTABUS_ROOT") or "./data",
                   help="where topics live: a folder or an object-store URI "
                        "(default: $DELTABUS_ROOT or ./data)")
    s.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                   help="how to reach --root: delta-rs's storage options (AWS_ENDPOINT_URL, "
                        "AWS_ACCESS_KEY_ID, AZURE_STORAGE_ACCOUNT_KEY, ...); repeatable, over "
                        "--storage-options-file and spark.deltabus.storage.KEY")
    s.add_argument("--storage-options-file", metavar="FILE",
                   help="a properties file of storage options (KEY=VALUE lines), so secrets "
                        "stay out of the command line")
    s.add_argument("--brokers", type=int, default=3, help="broker count (default 3)")
    s.add_argument("--master", help="Spark master URL (default: local with 2 x brokers + 2 "
                                    "slots, room to scale to twice the brokers)")
    s.add_argument("--port", type=int,
                   help="bootstrap port (default: the port of --bootstrap-server)")
    s.add_argument("--kafka-port", type=int, default=None,
                   help="Kafka protocol bootstrap port; broker b listens on it + 1 + b "
                        "(default: $DELTABUS_KAFKA_PORT or 9092; 0: any free ports; -1: none)")
    s.add_argument("--metrics-port", type=int, default=cfg.DEFAULT_METRICS_PORT,
                   help="port of the driver's Prometheus metrics and service discovery; broker "
                        f"b serves its metrics on it + 1 + b (default {cfg.DEFAULT_METRICS_PORT};"
                        " 0: any free ports; -1: none)")
    s.add_argument("--console-port", type=int, default=cfg.DEFAULT_CONSOLE_PORT,
                   help="port of the console, a read-only web page of the cluster (default "
                        f"{cfg.DEFAULT_CONSOLE_PORT}; 0: any free port; -1: none)")
    s.add_argument("--schema-registry-port", type=int, default=cfg.DEFAULT_SCHEMA_REGISTRY_PORT,
                   help="port of the schema registry's REST API, Confluent's "
                        f"(default {cfg.DEFAULT_SCHEMA_REGISTRY_PORT}; 0: any free port; "
                        "-1: not served)")
    broker_security.add_arguments(s)
    s.set_defaults(func=start)
    cluster_scale.add_parsers(commands, parent)


def scale_headroom(brokers: int) -> int:
    """Task slots of the local master `cluster start` picks: room to scale to twice the
    brokers (each holds one) with one slot to spare, and at least two for other jobs."""
    return 2 * brokers + 2


def spark_session(master: str, *, app_name: str = "deltabus") -> Any:
    """A SparkSession on `master` with the loopback settings of `local_spark`.

    Kept in step with deltabus.cluster.cluster.local_spark by hand (it takes no master).
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", cfg.DEFAULT_HOST)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    host = os.environ["SPARK_LOCAL_IP"]
    return (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.host", host)
        .config("spark.driver.bindAddress", host)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )


def start(args: argparse.Namespace) -> int:
    """Start Spark and the cluster, serve until Ctrl-C or SIGTERM, then stop both."""
    try:  # first: without the server install there is nothing to start
        with extras.needs("deltabus cluster start", extras.SERVER):
            from deltabus.cluster.cluster import Cluster, local_spark
    except ModuleNotFoundError as e:
        raise CliError(str(e)) from None
    host, port = split_host_port(args.bootstrap_server)
    port = args.port if args.port is not None else port
    if args.brokers < 1:
        raise CliError(f"--brokers must be at least 1, not {args.brokers}")
    if not 0 < port < 65536:
        raise CliError(f"--port must be in 1..65535, not {port}")
    settings = broker_security.cluster_settings(args, (host, port))  # before Spark starts
    storage_options = {
        **(read_properties(args.storage_options_file, "--storage-options-file")
           if args.storage_options_file else {}),
        **parse_properties(args.storage_option, "--storage-option")}
    try:
        normalize_root(args.root)
    except errors.InvalidConfigError as e:
        raise CliError(f"--root: {e.message}") from None
    users = broker_security.scram_users(args)
    kafka = {} if args.kafka_port is None else {"kafka_port": args.kafka_port}
    try:  # the settings together (num.partitions at least 1, ...), before Spark starts
        cfg.ClusterConfig(root=args.root, brokers=args.brokers, port=port, host=host, **kafka,
                          **settings)
    except ValueError as e:
        raise CliError(str(e)) from None
    except errors.DeltaBusError as e:
        raise CliError(e.message) from None
    spark = spark_session(args.master) if args.master else local_spark(scale_headroom(args.brokers))
    spark.sparkContext.setLogLevel(SPARK_LOG_LEVEL)
    try:
        try:
            cluster = Cluster(spark, root=args.root, brokers=args.brokers, port=port,
                              host=host, storage_options=storage_options, **kafka,
                              schema_registry_port=args.schema_registry_port,
                              metrics_port=args.metrics_port, console_port=args.console_port,
                              **settings).start()
        except (TimeoutError, ValueError, ListenerBindError) as e:
            raise CliError(str(e)) from None
        except errors.DeltaBusError as e:  # the root unreachable with these options
            raise CliError(e.message) from None
        try:
            for user in users:  # before clients are told where to connect
                cluster.add_scram_user(user.name, user.password, mechanism=user.mechanism,
                                       iterations=user.iterations)
                print(f"Added {user.mechanism} credential for user {user.name}", flush=True)
            _announce(cluster, args.brokers, broker_security.describe(settings))
            _serve_until_signalled()
        finally:
            spark.sparkContext.setLogLevel("ERROR")  # cancelled broker tasks are expected now
            cluster.stop()
    finally:
        spark.stop()
    print("deltabus cluster stopped", flush=True)
    return 0


def _announce(cluster: Cluster, brokers: int, security: str | None) -> None:
    print(f"deltabus cluster started: bootstrap {cluster.bootstrap_servers}, "
          f"{brokers} brokers, data under {cluster.config.root}", flush=True)
    if cluster.config.listener_config().kafka:
        print(f"Kafka clients: bootstrap.servers={cluster.kafka_bootstrap_servers}",
              flush=True)
    if cluster.config.schema_registry_port >= 0:
        print(f"Schema registry: schema.registry.url={cluster.schema_registry_url}", flush=True)
    if cluster.config.metrics_port >= 0:
        print(f"Prometheus service discovery: {cluster.prometheus_sd_url}", flush=True)
    if cluster.config.console_port >= 0:
        print(f"Console: {cluster.console_url}", flush=True)
    if cluster.config.listeners is not None:
        print("Listeners: " + ", ".join(f"{e.name}://{e.host}:{e.port} ({e.door})"
                                        for e in cluster.listener_endpoints), flush=True)
    if security:
        print(security, flush=True)
    if cluster.spark_ui_url:
        print(f"Spark UI: {cluster.spark_ui_url}", flush=True)
    print("Press Ctrl-C to stop.", flush=True)


def _serve_until_signalled() -> None:
    """Block until Ctrl-C or SIGTERM, then return for a clean stop.

    Both signals only set an event: PySpark's own SIGINT handler would cancel every job, killing
    the brokers before they flush, and interrupt a py4j call half-way. The handlers stay for the
    rest of the process, so a second Ctrl-C during the stop does not reach PySpark's either.
    """
    stopped = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopped.set())
    while not stopped.wait(1.0):
        pass
    print("stopping the deltabus cluster...", flush=True)
