"""`deltabus configs`: Kafka's kafka-configs.sh for topic and group configs, users' SCRAM
credentials and client quotas, over AdminClient.

Same flags (`--entity-type topics --entity-name T`, or `--topic T`; `--describe [--all]`;
`--alter --add-config k=v,k2=[a,b] --delete-config k3`) and the same output lines, so a Kafka
user's commands and scripts carry over. Topics and groups (`--entity-type groups`: a share
group's share.auto.offset.reset, ...) have dynamic configs; brokers take theirs when the cluster
starts. Users (`--entity-type users`) have SCRAM credentials
(`cli.user_scram_configs`) and quotas; users, clients, and a user with a client id together
(`--entity-type users --entity-name U --entity-type clients --entity-name C`) have quotas
(`cli.client_quota_configs`).
"""

from __future__ import annotations

import argparse
import re

from deltabus import config as cfg
from deltabus import quotas
from deltabus.cli import client_quota_configs, user_scram_configs
from deltabus.cli.options import CliError, add_command_config, admin_settings
from deltabus.client.admin import AdminClient

ENTITY_TYPES = ("topics", "users", "clients", "brokers", "groups")


class _EntityName(argparse.Action):
    """--entity-name N and --entity-default, in order, into one list (a default is
    `client_quota_configs.DEFAULT`), so each pairs with the --entity-type before it."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        names = list(getattr(namespace, "entity_names", None) or [])
        names.append(client_quota_configs.DEFAULT if option_string == "--entity-default"
                     else values)
        namespace.entity_names = names


def add_parser(subparsers: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser("configs", parents=[parent],
                              help="describe and alter topic and group configs and users' "
                                   "SCRAM credentials (kafka-configs.sh)")
    actions = p.add_mutually_exclusive_group()
    actions.add_argument("--describe", action="store_true", help="list configs")
    actions.add_argument("--alter", action="store_true", help="change configs")
    p.add_argument("--entity-type", choices=ENTITY_TYPES, action="append",
                   help="topics, groups (share groups' configs), users (SCRAM credentials "
                        "and quotas) or clients (quotas); users and clients together: the "
                        "quotas of a user's client id")
    p.add_argument("--entity-name", dest="entity_names", action=_EntityName,
                   help="the topic, user or client id (default with --describe: every one)")
    p.add_argument("--entity-default", dest="entity_names", action=_EntityName, nargs=0,
                   help="the default user or client id (quotas), in place of --entity-name")
    p.add_argument("--topic", help="the topic: --entity-type topics --entity-name TOPIC")
    p.add_argument("--all", action="store_true",
                   help="with --describe: every config, not only the overrides")
    p.add_argument("--add-config", metavar="K=V,K2=[A,B]",
                   help="with --alter: configs to set; list values go in square brackets. "
                        "Users: SCRAM-SHA-256=[iterations=8192,password=SECRET] (iterations "
                        "optional, 4096 by default), SCRAM-SHA-512=[password=SECRET]")
    p.add_argument("--delete-config", metavar="K,K2",
                   help="with --alter: overrides to remove (back to the default); users: "
                        "SCRAM-SHA-256, SCRAM-SHA-512")
    add_command_config(p, clients="admin")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not (args.describe or args.alter):
        raise CliError("Command must include exactly one action: --describe, --alter")
    types, names = list(args.entity_type or ()), list(args.entity_names or ())
    if "clients" in types or len(types) > 1:
        return _quotas(args, types, names)
    if any(n is client_quota_configs.DEFAULT for n in names) and types != ["users"]:
        raise CliError("--entity-default is for quotas of users and clients")
    args.entity_type = types[0] if types else None
    args.entity_name = names[0] if names else None
    if args.entity_name is client_quota_configs.DEFAULT:
        return _quotas(args, types, names)
    if args.topic is not None:
        if args.entity_type not in (None, "topics") or args.entity_name is not None:
            raise CliError("--topic cannot be used with --entity-type or --entity-name")
        args.entity_type, args.entity_name = "topics", args.topic
    if args.entity_type is None:
        raise CliError("--entity-type must be specified")
    if args.entity_type == "brokers":
        raise CliError("deltabus brokers take their configs when the cluster starts (deltabus "
                       "cluster start); only topics and groups have dynamic configs")
    if args.alter:
        return alter(args)
    if args.add_config is not None or args.delete_config is not None:
        raise CliError("--add-config and --delete-config can only be used with --alter")
    if args.entity_type == "users":
        if args.all:
            raise CliError("--all can only be used with --entity-type topics or groups")
        client_quota_configs.describe(client_quota_configs.entities(types, names), args)
        return user_scram_configs.describe(args)
    return describe(args)


def _quotas(args: argparse.Namespace, types: list[str], names: list[object]) -> int:
    """Quotas only: clients, a user's client ids, or a default entity."""
    if args.topic is not None or args.all:
        raise CliError("--topic and --all are for topics")
    pairs = client_quota_configs.entities(types, names)
    if not args.alter:
        if args.add_config is not None or args.delete_config is not None:
            raise CliError("--add-config and --delete-config can only be used with --alter")
        client_quota_configs.describe(pairs, args)
        return 0
    added, deleted = _changes(args)
    client_quota_configs.alter(pairs, added, deleted, args)
    print(_completed(pairs))
    return 0


def _completed(pairs: client_quota_configs.Entities) -> str:
    """kafka-configs' line after an alter, naming the first entity type."""
    kind, name = pairs[0]
    shown = "user" if kind == quotas.USER else "client"
    if name is client_quota_configs.DEFAULT:
        return f"Completed updating default config for {shown}s in the cluster."
    return f"Completed updating config for {shown} {name}."


def describe(args: argparse.Namespace) -> int:
    groups = args.entity_type == "groups"
    with AdminClient(args.bootstrap_server, **admin_settings(args)) as admin:
        names = ([args.entity_name] if args.entity_name else
                 [g for g, _ in admin.list_share_groups()] if groups else admin.list_topics())
        results = admin.describe_configs(names, groups=groups)
    own = "GROUP_CONFIG" if groups else "DYNAMIC_TOPIC_CONFIG"
    for name in names:
        print(f"{'All' if args.all else 'Dynamic'} configs for {'group' if groups else 'topic'} "
              f"{name} are:")
        for entry in results[name]:
            if args.all or entry.source == own:
                print(f"  {format_entry(entry)}")
    return 0


def format_entry(entry: cfg.ConfigEntry) -> str:
    """One config as kafka-configs prints it."""
    synonyms = ", ".join(f"{source}:{name}={value}" for source, name, value in entry.synonyms)
    return (f"{entry.name}={entry.value} sensitive={str(entry.sensitive).lower()} "
            f"synonyms={{{synonyms}}}")


def _changes(args: argparse.Namespace) -> tuple[list[tuple[str, str]], list[str]]:
    """(--add-config pairs, --delete-config keys), checked as kafka-configs checks them."""
    if args.add_config is None and args.delete_config is None:
        raise CliError("At least one of --add-config or --delete-config must be specified with "
                       "--alter")
    added = parse_add_config(args.add_config or "")
    deleted = [k.strip() for k in (args.delete_config or "").split(",") if k.strip()]
    set_keys = {k for k, _ in added}
    both = [k for k in deleted if k in set_keys]
    if both:
        raise CliError(f"Invalid config(s): {','.join(both)} cannot be both added and deleted")
    return added, deleted


def alter(args: argparse.Namespace) -> int:
    if args.all:
        raise CliError("--all can only be used with --describe")
    added, deleted = _changes(args)
    if args.entity_type == "users":
        return _alter_user(args, added, deleted)
    kind = "group" if args.entity_type == "groups" else "topic"
    if not args.entity_name:
        raise CliError(f"An entity name must be specified with --alter of {kind}s")
    ops = [cfg.AlterConfigOp(k, cfg.SET, v) for k, v in added]
    ops += [cfg.AlterConfigOp(k, cfg.DELETE) for k in deleted]
    with AdminClient(args.bootstrap_server, **admin_settings(args)) as admin:
        admin.incremental_alter_configs({args.entity_name: ops}, groups=kind == "group")
    print(f"Completed updating config for {kind} {args.entity_name}.")
    return 0


def _alter_user(args: argparse.Namespace, added: list[tuple[str, str]],
                deleted: list[str]) -> int:
    """A user's quotas and SCRAM credentials: kafka-configs takes both in one command."""
    quota_added = [(k, v) for k, v in added if k in quotas.QUOTA_KEYS]
    quota_deleted = [k for k in deleted if k in quotas.QUOTA_KEYS]
    scram_added = [(k, v) for k, v in added if k not in quotas.QUOTA_KEYS]
    scram_deleted = [k for k in deleted if k not in quotas.QUOTA_KEYS]
    if quota_added or quota_deleted:
        if not args.entity_name:
            raise CliError("An entity name must be specified with --alter of users")
        client_quota_configs.alter([(quotas.USER, args.entity_name)], quota_added,
                                   quota_deleted, args)
        if not (scram_added or scram_deleted):
            print(f"Completed updating config for user {args.entity_name}.")
            return 0
    return user_scram_configs.alter(args, scram_added, scram_deleted)


_PAIR = re.compile(r"\s*([^=,\s]+)\s*=\s*(\[[^\]]*\]|[^,]*)\s*(?:,|$)")


def parse_add_config(text: str) -> list[tuple[str, str]]:
    """`k1=v1,k2=[a,b]` as kafka-configs reads it: pairs split at commas, a bracketed value
    keeps its commas (the brackets go)."""
    pairs: list[tuple[str, str]] = []
    position = 0
    text = text.strip()
    while position < len(text):
        match = _PAIR.match(text, position)
        if match is None or match.end() == position:
            raise CliError('Invalid entity config: all configs to be added must be in the format '
                           '"key=val".')
        key, value = match.group(1), match.group(2).strip()
        if value.startswith("["):
            value = value[1:-1]
        pairs.append((key, value))
        position = match.end()
    return pairs
