"""`deltabus transactions`: Kafka's kafka-transactions.sh over AdminClient.

`--bootstrap-server X list` (TransactionalId, Coordinator, ProducerId, TransactionState) and
`describe --transactional-id T` (adds ProducerEpoch, TransactionTimeoutMs,
CurrentTransactionStartTimeMs, TransactionDurationMs, TopicPartitions), the same columns as
Kafka's tool. The coordinator is the broker FindCoordinator names for the transactional id
(`metadata.coordinator_node`). Times are the coordinator's, in ms; a column with no value is
"None", as Kafka's tool prints it.
"""

from __future__ import annotations

import argparse
import time

from deltabus.cli.consumer_groups import _print_table
from deltabus.cli.options import add_command_config, admin_settings
from deltabus.client.admin import AdminClient
from deltabus.metadata import coordinator_node


def add_parser(subparsers: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser("transactions", parents=[parent],
                              help="list and describe transactions (kafka-transactions.sh)")
    add_command_config(p, clients="admin")
    actions = p.add_subparsers(dest="transactions_command", metavar="COMMAND", required=True)
    listing = actions.add_parser("list", help="list transactions")
    describe = actions.add_parser("describe", help="describe a transaction")
    describe.add_argument("--transactional-id", required=True, metavar="ID",
                          help="the transactional id to describe")
    for sub in (listing, describe):
        # Also after the command (Kafka's tool takes them first); SUPPRESS keeps a value
        # given before the command from being reset to the default.
        sub.add_argument("--bootstrap-server", default=argparse.SUPPRESS, metavar="HOST:PORT",
                         help="the cluster to talk to")
        sub.add_argument("--command-config", dest="command_config", default=argparse.SUPPRESS,
                         metavar="FILE", help="a properties file of admin configs")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with AdminClient(args.bootstrap_server, **admin_settings(args)) as admin:
        brokers = [b.broker_id for b in admin.describe_cluster()["brokers"]]
        if args.transactions_command == "list":
            rows = [["TransactionalId", "Coordinator", "ProducerId", "TransactionState"]]
            rows += [[t, str(coordinator_node(t, brokers)), str(p), s]
                     for t, p, s in admin.list_transactions()]
            _print_table(rows)
            return 0
        txn = admin.describe_transactions([args.transactional_id])[args.transactional_id]
    now_ms = int(time.time() * 1000)
    started = txn.start_ms >= 0
    _print_table([
        ["CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
         "TransactionTimeoutMs", "CurrentTransactionStartTimeMs", "TransactionDurationMs",
         "TopicPartitions"],
        [str(coordinator_node(txn.transactional_id, brokers)), txn.transactional_id,
         str(txn.producer_id), str(txn.producer_epoch), txn.state, str(txn.timeout_ms),
         str(txn.start_ms) if started else "None",
         str(now_ms - txn.start_ms) if started else "None",
         ",".join(f"{t}-{p}" for t, p in sorted(txn.partitions))]])
    return 0
