"""`deltabus acls`: Kafka's kafka-acls.sh over AdminClient's create_acls, describe_acls and
delete_acls, with its flags and its output, so a Kafka user's commands and scripts carry over:

    --add --allow-principal User:alice --operation Read --operation Write --topic orders
    --add --allow-principal User:bob --consumer --topic orders --group billing
    --add --allow-principal User:carol --producer --topic logs- --resource-pattern-type prefixed
    --remove --allow-principal User:alice --operation Write --topic orders --force
    --list [--topic orders] [--principal User:alice] [--resource-pattern-type match]

An ACL is a resource pattern (`--topic`, `--group`, `--cluster`, `--transactional-id`, each
`--resource-pattern-type` literal or prefixed) and entries: every `--allow-principal` and
`--deny-principal` with every `--operation` (All without one) from every `--allow-host` or
`--deny-host` (* without one). `--producer` stands for Write, Describe and Create on the topics
(Write and Describe on transactional ids, IdempotentWrite on the cluster with `--idempotent`),
`--consumer` for Read and Describe on the topics and Read on the groups. `--remove` without
principals removes every ACL of the resources; `--list` and `--remove` also take the pattern
types any and match. After `--add` and `--remove` the resources' ACLs are listed, as Kafka does.

`--remove` asks before it removes, as Kafka's does (y to go on; anything else, or no terminal,
skips that resource); `--force` removes without asking.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable

from deltabus import errors
from deltabus.cli.options import CliError, add_command_config, admin_settings
from deltabus.client.admin import AdminClient
from deltabus.security.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclBindingFilter,
    Operation,
    PatternType,
    Permission,
    ResourcePattern,
    ResourceType,
    by_resource,
)

WILDCARD_HOST = "*"
# What each resource type's ACLs may allow (Kafka's AclEntry.supportedOperations), and ALL.
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[Operation, ...]] = {
    ResourceType.TOPIC: (Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DESCRIBE,
                         Operation.DELETE, Operation.ALTER, Operation.DESCRIBE_CONFIGS,
                         Operation.ALTER_CONFIGS, Operation.ALL),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE, Operation.ALL),
    ResourceType.CLUSTER: (Operation.CREATE, Operation.CLUSTER_ACTION, Operation.DESCRIBE_CONFIGS,
                           Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE, Operation.ALTER,
                           Operation.DESCRIBE, Operation.ALL),
    ResourceType.TRANSACTIONAL_ID: (Operation.DESCRIBE, Operation.WRITE, Operation.ALL),
}
OPERATION_NAMES = [  # kafka-acls' names (Kafka's help lists them so)
    "Read", "Write", "Create", "Delete", "Alter", "Describe", "ClusterAction",
    "DescribeConfigs", "AlterConfigs", "IdempotentWrite", "All"]
PATTERN_TYPES = {"literal": PatternType.LITERAL, "prefixed": PatternType.PREFIXED,
                 "any": PatternType.ANY, "match": PatternType.MATCH}

Entry = tuple[str, str, Operation, Permission]  # principal, host, operation, permission


def add_parser(subparsers: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser("acls", parents=[parent],
                              help="add, remove and list ACLs (kafka-acls.sh)")
    actions = p.add_mutually_exclusive_group()
    actions.add_argument("--add", action="store_true", help="add ACLs")
    actions.add_argument("--remove", action="store_true", help="remove ACLs")
    actions.add_argument("--list", action="store_true",
                         help="list ACLs (of the resources given, else all)")
    for flag, what in (("--allow-principal", "allowed"), ("--deny-principal", "denied")):
        p.add_argument(flag, action="append", metavar="TYPE:NAME",
                       help=f"a principal {what} (User:alice, or User:* for every user); "
                            "repeatable")
    for flag, what in (("--allow-host", "allow-principal"), ("--deny-host", "deny-principal")):
        p.add_argument(flag, action="append", metavar="HOST",
                       help=f"a host the --{what} ACLs apply from (default * for any); "
                            "repeatable")
    p.add_argument("--operation", action="append", metavar="OPERATION",
                   help=f"an operation allowed or denied (default All): "
                        f"{', '.join(OPERATION_NAMES)}; repeatable")
    p.add_argument("--topic", action="append", metavar="TOPIC", help="a topic; repeatable")
    p.add_argument("--group", action="append", metavar="GROUP",
                   help="a consumer group; repeatable")
    p.add_argument("--cluster", action="store_true", help="the cluster")
    p.add_argument("--transactional-id", action="append", metavar="ID",
                   help="a transactional id; repeatable")
    p.add_argument("--resource-pattern-type", default="literal", type=str.lower,
                   choices=list(PATTERN_TYPES),
                   help="literal (the name exactly, * for every one) or prefixed (names that "
                        "start with it); --list and --remove also take any (either, the name "
                        "exactly) and match (every ACL that applies to the named resource). "
                        "Default literal")
    p.add_argument("--principal", action="append", metavar="TYPE:NAME",
                   help="with --list: only this principal's ACLs; repeatable")
    p.add_argument("--producer", action="store_true",
                   help="the ACLs a producer needs: Write, Describe, Create on the topics")
    p.add_argument("--idempotent", action="store_true",
                   help="with --producer: also IdempotentWrite on the cluster")
    p.add_argument("--consumer", action="store_true",
                   help="the ACLs a consumer needs: Read, Describe on the topics, Read on the "
                        "groups")
    p.add_argument("--force", action="store_true", help="with --remove: do not ask")
    add_command_config(p, clients="admin")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_args(args)
    with AdminClient(args.bootstrap_server, **admin_settings(args)) as admin:
        if args.add:
            add_acls(admin, args)
        elif args.remove:
            remove_acls(admin, args)
        list_acls(admin, args)
    return 0


def check_args(args: argparse.Namespace) -> None:
    """Kafka's AclCommand.checkArgs, with its messages."""
    if not (args.add or args.remove or args.list):
        raise CliError("Command must include exactly one action: --list, --add, --remove.")
    given = {name for name in ("producer", "consumer", "allow_host", "allow_principal",
                               "deny_host", "deny_principal", "operation", "principal")
             if getattr(args, name)}
    if args.list:
        _invalid_with("list", given & {"producer", "consumer", "allow_host", "allow_principal",
                                       "deny_host", "deny_principal"})
    for option in ("producer", "consumer"):
        if option in given:
            _invalid_with(option, given & {"operation", "deny_principal", "deny_host"})
    if args.principal and not args.list:
        raise CliError("The --principal option is only available if --list is set")
    if args.producer and not args.topic:
        raise CliError("With --producer you must specify a --topic")
    if args.idempotent and not args.producer:
        raise CliError("The --idempotent option is only available if --producer is set")
    if args.consumer and (not args.topic or not args.group or (not args.producer and (
            args.cluster or args.transactional_id))):
        raise CliError("With --consumer you must specify a --topic and a --group and no "
                       "--cluster or --transactional-id option should be specified.")


def _invalid_with(option: str, others: set[str]) -> None:
    if others:
        names = ",".join(sorted(o.replace("_", "-") for o in others))
        raise CliError(f'Option "[{option}]" can\'t be used with option "[{names}]"')


# ---- resources and entries from the flags (Kafka's AclCommand) -------------------------------

def resource_filters(args: argparse.Namespace, *, required: bool = True
                     ) -> list[ResourcePattern]:
    """The resources the flags name, as patterns of --resource-pattern-type (the cluster only
    with literal, as Kafka's); `required`: none is an error."""
    pattern = PATTERN_TYPES[args.resource_pattern_type]
    out: list[ResourcePattern] = [(ResourceType.TOPIC, t.strip(), pattern)
                                  for t in args.topic or ()]
    if pattern == PatternType.LITERAL and (args.cluster or args.idempotent):
        out.append((ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL))
    out += [(ResourceType.GROUP, g.strip(), pattern) for g in args.group or ()]
    out += [(ResourceType.TRANSACTIONAL_ID, x, pattern) for x in args.transactional_id or ()]
    if not out and required:
        raise CliError("You must provide at least one resource: --topic <topic> or --cluster "
                       "or --group <group> or --transactional-id <id>")
    return list(dict.fromkeys(out))


def resource_entries(args: argparse.Namespace) -> dict[ResourcePattern, list[Entry]]:
    """Each resource's entries, from --operation or --producer / --consumer."""
    out: dict[ResourcePattern, list[Entry]] = {}
    if not (args.producer or args.consumer):
        operations = [parse_operation(o) for o in args.operation or ["All"]]
        out = {r: entries(args, operations) for r in resource_filters(args)}
    if args.producer:
        for r in resource_filters(args):
            if r[0] == ResourceType.TOPIC:
                out[r] = entries(args, [Operation.WRITE, Operation.DESCRIBE, Operation.CREATE])
            elif r[0] == ResourceType.TRANSACTIONAL_ID:
                out[r] = entries(args, [Operation.WRITE, Operation.DESCRIBE])
            elif r[0] == ResourceType.CLUSTER and args.idempotent:
                out[r] = entries(args, [Operation.IDEMPOTENT_WRITE])
    if args.consumer:
        for r in resource_filters(args):
            wanted = {ResourceType.TOPIC: [Operation.READ, Operation.DESCRIBE],
                      ResourceType.GROUP: [Operation.READ]}.get(r[0])
            if wanted:
                out[r] = list(dict.fromkeys(entries(args, wanted) + out.get(r, [])))
    for (resource_type, _, _), found in out.items():
        supported = SUPPORTED_OPERATIONS[resource_type]
        if any(operation not in supported for _, _, operation, _ in found):
            raise CliError(f"ResourceType {resource_type.name} only supports operations "
                           f"{','.join(o.name for o in supported)}")
    return out


def entries(args: argparse.Namespace, operations: list[Operation]) -> list[Entry]:
    """Every principal with every operation from every host: allowed, then denied."""
    out: list[Entry] = []
    for principals, hosts, permission in (
            (args.allow_principal, args.allow_host, Permission.ALLOW),
            (args.deny_principal, args.deny_host, Permission.DENY)):
        for principal in (parse_principal(p) for p in principals or ()):
            out += [(principal, host.strip(), operation, permission)
                    for operation in operations for host in hosts or [WILDCARD_HOST]]
    return list(dict.fromkeys(out))


def parse_principal(text: str) -> str:
    kind, colon, name = text.strip().partition(":")
    if not colon or not kind or not name:
        raise CliError(f"expected a string in format principalType:principalName but got "
                       f"{text}")
    return f"{kind}:{name}"


def parse_operation(name: str) -> Operation:
    """Kafka's names (Read, DescribeConfigs), in any case, or the enum's (DESCRIBE_CONFIGS)."""
    key = re.sub(r"(?<=[a-z])(?=[A-Z])", "_", name.strip()).upper()
    member = Operation.__members__.get(key)
    if member is None or member in (Operation.ANY, Operation.UNKNOWN):
        raise CliError(f"Unknown operation name {name}: use one of "
                       f"{', '.join(OPERATION_NAMES)}")
    return member


# ---- the actions -------------------------------------------------------------------------------

def add_acls(admin: AdminClient, args: argparse.Namespace) -> None:
    pattern = PATTERN_TYPES[args.resource_pattern_type]
    if pattern not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise CliError(f"A '--resource-pattern-type' value of '{pattern.name}' is not valid "
                       f"when adding acls.")
    wanted = resource_entries(args)
    if not wanted or any(not found for found in wanted.values()):
        raise CliError("You must specify one of: --allow-principal, --deny-principal when "
                       "trying to add ACLs.")
    for resource, found in wanted.items():
        print(_block(f"Adding ACLs for resource `{format_pattern(resource)}`",
                     [format_entry(e) for e in found]))
        results = admin.create_acls([_binding(resource, entry) for entry in found])
        _raise_first(results.values())


def remove_acls(admin: AdminClient, args: argparse.Namespace) -> None:
    for resource, found in resource_entries(args).items():
        shown = format_pattern(resource)
        question = (f"Are you sure you want to delete all ACLs for resource filter `{shown}`? "
                    f"(y/n)" if not found else
                    _block("Are you sure you want to remove ACLs", [format_entry(e)
                                                                    for e in found])
                    + f" from resource filter `{shown}`? (y/n)")
        if not (args.force or confirm(question)):
            continue
        filters = [_filter(resource, entry) for entry in found] or [_filter(resource)]
        _raise_first(admin.delete_acls(filters).values())


def list_acls(admin: AdminClient, args: argparse.Namespace) -> None:
    """The ACLs of the resources named (all without any), per principal with --principal."""
    filters = [_filter(r) for r in resource_filters(args, required=False)]
    found: list[AclBinding] = []
    for f in filters or [AclBindingFilter()]:
        found += [a for a in admin.describe_acls(f) if a not in found]
    if not args.principal:
        print_acls(found)
        return
    for principal in (parse_principal(p) for p in args.principal):
        print(f"ACLs for principal `{principal}`")
        print_acls([a for a in found if a.principal == principal])


def print_acls(acls: Iterable[AclBinding]) -> None:
    for resource, found in by_resource(acls).items():
        print(_block(f"Current ACLs for resource `{format_pattern(resource)}`",
                     [format_entry((a.principal, a.host, a.operation, a.permission))
                      for a in found]))


def confirm(question: str) -> bool:
    """Kafka's confirmAction: the question, then y (any case) on stdin goes on."""
    print(question, flush=True)
    line = sys.stdin.readline()
    return line.strip().lower() == "y"


def _binding(resource: ResourcePattern, entry: Entry) -> AclBinding:
    (resource_type, name, pattern), (principal, host, operation, permission) = resource, entry
    return AclBinding(resource_type, name, pattern, principal, host, operation, permission)


def _filter(resource: ResourcePattern, entry: Entry | None = None) -> AclBindingFilter:
    """The ACLs of a resource filter: every one, or those exactly like `entry`."""
    resource_type, name, pattern = resource
    if entry is None:
        return AclBindingFilter(resource_type, name, pattern)
    principal, host, operation, permission = entry
    return AclBindingFilter(resource_type, name, pattern, principal, host, operation, permission)


def _raise_first(results: Iterable[object]) -> None:
    """As Kafka's `all().get()`: the first error fails the command."""
    for result in results:
        if isinstance(result, errors.DeltaBusError):
            raise result


# ---- Kafka's formats ---------------------------------------------------------------------------

def format_pattern(resource: ResourcePattern) -> str:
    """Kafka's ResourcePattern.toString."""
    resource_type, name, pattern = resource
    return (f"ResourcePattern(resourceType={resource_type.name}, name={name}, "
            f"patternType={pattern.name})")


def format_entry(entry: Entry) -> str:
    """Kafka's AccessControlEntry.toString."""
    principal, host, operation, permission = entry
    return (f"(principal={principal}, host={host}, operation={operation.name}, "
            f"permissionType={permission.name})")


def _block(header: str, lines: list[str]) -> str:
    """AclCommand's `s"$header: $Newline ${acls.map("\\t" + _).mkString(Newline)} $Newline"`
    (println then ends it with an empty line)."""
    body = "\n".join("\t" + line for line in lines)
    return f"{header}: \n {body} \n"
