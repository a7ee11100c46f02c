"""`deltabus schemas`: the schema registry from the command line, over gRPC (AdminClient's
`schema_registry`), with the action flags Kafka's tools use (kafka-topics.sh's --create, --list,
--describe, --delete) and the registry's own words (subject, version, id, compatibility):

    deltabus schemas --register --subject payments-value --schema-file payment.avsc
    deltabus schemas --list [--subject payments-value] [--deleted]
    deltabus schemas --describe --subject payments-value [--version 2]   (or --id 3)
    deltabus schemas --compatibility --subject payments-value [--schema-file new.avsc]
    deltabus schemas --compatibility --subject payments-value --set FULL   (--subject "": global)
    deltabus schemas --delete --subject payments-value [--version 1] [--permanent]

A refusal is one line, `Error: <the registry's message> (error code N)`, exit 1; an incompatible
schema checked with --compatibility is no error: it prints why, and exits 1 so scripts can test.
"""

from __future__ import annotations

import argparse
import json

from deltabus.cli.options import CliError, add_command_config, admin_settings
from deltabus.client.admin import AdminClient
from deltabus.rpc.schema_codec import RegistryOverGrpc
from deltabus.schemas import SchemaReference, SchemaRegistryError, SchemaType

ACTIONS = ("register", "list", "describe", "compatibility", "delete")


def add_parser(subparsers: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser("schemas", parents=[parent],
                              help="the schema registry: register, list, describe, "
                                   "compatibility, delete")
    actions = p.add_mutually_exclusive_group(required=True)
    for action in ACTIONS:
        actions.add_argument(f"--{action}", action="store_true")
    p.add_argument("--subject", help="the subject (Confluent's TopicNameStrategy: "
                                     "<topic>-value, <topic>-key)")
    p.add_argument("--schema-file", metavar="FILE", help="the schema's text (.avsc, .json, "
                                                         ".proto)")
    p.add_argument("--schema-type", choices=[t.value for t in SchemaType],
                   help="default: from the file's extension (.proto, .json), else AVRO")
    p.add_argument("--reference", action="append", metavar="NAME=SUBJECT:VERSION", default=[],
                   help="a schema the registered one uses, by the name it uses; repeatable")
    p.add_argument("--version", help="a subject's version (a number, or latest)")
    p.add_argument("--id", type=int, help="a schema id")
    p.add_argument("--deleted", action="store_true", help="include soft-deleted versions")
    p.add_argument("--permanent", action="store_true",
                   help="--delete: delete soft-deleted versions for good")
    p.add_argument("--set", metavar="LEVEL", help="--compatibility: set the subject's level "
                   "(NONE, BACKWARD, FORWARD, FULL, or their _TRANSITIVE forms)")
    p.add_argument("--unset", action="store_true",
                   help="--compatibility: the subject follows the global level again")
    add_command_config(p, clients="admin")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with AdminClient(args.bootstrap_server, **admin_settings(args)) as admin:
        registry = admin.schema_registry
        try:
            if args.register:
                return _register(registry, args)
            if args.list:
                return _list(registry, args)
            if args.describe:
                return _describe(registry, args)
            if args.compatibility:
                return _compatibility(registry, args)
            return _delete(registry, args)
        except SchemaRegistryError as e:
            raise CliError(f"{e.message} (error code {e.error_code})") from None


def _subject(args: argparse.Namespace, action: str) -> str:
    if args.subject is None:
        raise CliError(f"--{action} needs --subject")
    return str(args.subject)


def _version(args: argparse.Namespace) -> int:
    if args.version in (None, "latest"):
        return -1
    try:
        return int(args.version)
    except ValueError:
        raise CliError(f"--version must be a number or latest, not {args.version}") from None


def _schema(args: argparse.Namespace, action: str) -> tuple[str, str, list[SchemaReference]]:
    """(type, text, references) of --schema-file, --schema-type and --reference."""
    if args.schema_file is None:
        raise CliError(f"--{action} needs --schema-file")
    try:
        with open(args.schema_file) as f:
            text = f.read()
    except OSError as e:
        raise CliError(f"cannot read {args.schema_file}: {e.strerror}") from None
    kind = args.schema_type or (
        "PROTOBUF" if args.schema_file.endswith(".proto")
        else "JSON" if args.schema_file.endswith(".json") else "AVRO")
    references = []
    for item in args.reference:
        name, _, rest = item.partition("=")
        subject, _, version = rest.rpartition(":")
        if not name or not subject or not version.isdigit():
            raise CliError(f"--reference must be NAME=SUBJECT:VERSION, not {item}")
        references.append(SchemaReference(name, subject, int(version)))
    return kind, text, references


def _register(registry: RegistryOverGrpc, args: argparse.Namespace) -> int:
    subject = _subject(args, "register")
    kind, text, references = _schema(args, "register")
    held = registry.register_schema(subject, kind, text, references)
    print(f"Registered schema id {held.schema_id} as subject {held.subject} "
          f"version {held.version}")
    return 0


def _list(registry: RegistryOverGrpc, args: argparse.Namespace) -> int:
    if args.subject is None:
        for subject in registry.subjects(args.deleted, ""):
            print(subject)
        return 0
    print("Subject\tVersion\tId\tDeleted")
    for v in registry.subject_versions(args.subject, args.deleted):
        print(f"{v.subject}\t{v.version}\t{v.schema_id}\t{str(v.deleted).lower()}")
    return 0


def _describe(registry: RegistryOverGrpc, args: argparse.Namespace) -> int:
    if args.id is not None:
        stored = registry.schema_by_id(args.id)
        print(f"Id: {stored.schema_id}\tType: {stored.schema_type.value}")
    else:
        held = registry.subject_version(
            _subject(args, "describe"), _version(args), args.deleted)
        stored = registry.schema_by_id(held.schema_id)
        print(f"Subject: {held.subject}\tVersion: {held.version}\tId: {held.schema_id}\t"
              f"Type: {stored.schema_type.value}")
    for r in stored.references:
        print(f"Reference: {r.name}={r.subject}:{r.version}")
    print(_pretty(stored.text, stored.schema_type))
    return 0


def _pretty(text: str, schema_type: SchemaType) -> str:
    if schema_type == SchemaType.PROTOBUF:
        return text
    try:
        return json.dumps(json.loads(text), indent=2)
    except ValueError:
        return text


def _compatibility(registry: RegistryOverGrpc, args: argparse.Namespace) -> int:
    subject = _subject(args, "compatibility")
    if args.set is not None or args.unset:
        level = registry.set_compatibility_level(
            subject, None if args.unset else args.set)
        print(f"Compatibility of {subject or 'the registry'}: {level.value}")
        return 0
    if args.schema_file is None:
        level = registry.compatibility_level(subject, True)
        print(f"Compatibility of {subject or 'the registry'}: {level.value}")
        return 0
    kind, text, references = _schema(args, "compatibility")
    problems = registry.test_compatibility(
        subject, None if args.version is None else _version(args), kind, text, references)
    print(f"Compatible: {str(not problems).lower()}")
    for problem in problems:
        print(problem)
    return 1 if problems else 0


def _delete(registry: RegistryOverGrpc, args: argparse.Namespace) -> int:
    subject = _subject(args, "delete")
    if args.version is not None:
        version = registry.delete_schema_version(
            subject, _version(args), args.permanent)
        print(f"Deleted subject {subject} version {version}"
              + (" permanently" if args.permanent else ""))
        return 0
    versions = registry.delete_subject(subject, args.permanent)
    print(f"Deleted subject {subject} versions {', '.join(map(str, versions))}"
          + (" permanently" if args.permanent else ""))
    return 0
