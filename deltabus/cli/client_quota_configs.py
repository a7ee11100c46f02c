"""`deltabus configs --entity-type users|clients`: client quotas as kafka-configs.sh manages them,
with its flags and output lines:

    --alter --entity-type users --entity-name alice --add-config 'producer_byte_rate=1024'
    --alter --entity-type users --entity-name alice --entity-type clients --entity-name app \\
        --add-config 'consumer_byte_rate=2048,request_percentage=200'
    --alter --entity-type clients --entity-default --delete-config producer_byte_rate
    --describe --entity-type users [--entity-name alice | --entity-default]

`--entity-default` stands where a name would: the default entity of that type (`<default>`).
A describe lists the entities of exactly the named types (Kafka's strict filter), one line each:
"Quota configs for user-principal 'alice', client-id 'app' are producer_byte_rate=1024.0".
"""

from __future__ import annotations

import argparse

from deltabus import errors, quotas
from deltabus.cli.options import CliError, admin_settings
from deltabus.client.admin import (
    AdminClient,
    QuotaAlteration,
    QuotaEntity,
    QuotaFilterComponent,
)

# kafka-configs' entity types -> Kafka's quota entity types, and how its lines name them
ENTITY_TYPES = {"users": quotas.USER, "clients": quotas.CLIENT_ID}
_SHOWN = {quotas.USER: "user-principal", quotas.CLIENT_ID: "client-id"}
DEFAULT = object()  # --entity-default: in the names list where a name would be
Entities = list[tuple[str, "str | None | object"]]  # (entity type, name, None (any) or DEFAULT)


def entities(types: list[str], names: list[object]) -> Entities:
    """(type, name) pairs, in order, as kafka-configs pairs --entity-type with the names that
    follow (a type without a name: every entity of the type)."""
    if len(names) > len(types):
        raise CliError("Each --entity-name or --entity-default needs an --entity-type before it")
    unknown = [t for t in types if t not in ENTITY_TYPES]
    if unknown:
        raise CliError(f"Only users and clients can be combined for quotas, not {unknown[0]}")
    if len(set(types)) != len(types):
        raise CliError("An --entity-type can be given once")
    return [(ENTITY_TYPES[t], names[i] if i < len(names) else None)
            for i, t in enumerate(types)]


def describe(pairs: Entities, args: argparse.Namespace) -> dict[QuotaEntity, dict[str, float]]:
    """The quotas of the entities with exactly these types (a name, the default, or any)."""
    components = [QuotaFilterComponent(t, quotas.MATCH_DEFAULT) if n is DEFAULT
                  else QuotaFilterComponent(t) if n is None
                  else QuotaFilterComponent(t, quotas.MATCH_EXACT, str(n)) for t, n in pairs]
    with AdminClient(args.bootstrap_server, **admin_settings(args)) as admin:
        found = admin.describe_client_quotas(components, strict=True)
    for entity, values in found.items():
        print(f"Quota configs for {entity_text(entity)} are " + ", ".join(
            f"{k}={float(v)}" for k, v in sorted(values.items())))
    return found


def entity_text(entity: QuotaEntity) -> str:
    """kafka-configs' naming: "user-principal 'alice', client-id 'app'", "the default
    client-id"."""
    names = entity.as_dict()
    return ", ".join(f"{_SHOWN[t]} '{names[t]}'" if names[t] is not None
                     else f"the default {_SHOWN[t]}" for t in (quotas.USER, quotas.CLIENT_ID)
                     if t in names)


def alter(pairs: Entities, added: list[tuple[str, str]], deleted: list[str],
          args: argparse.Namespace) -> None:
    """Set and remove quotas of one entity in one request: all of them, or none."""
    if any(n is None for _, n in pairs):
        raise CliError("An entity name or --entity-default must be given for each "
                       "--entity-type with --alter")
    entity = QuotaEntity.of([(t, None if n is DEFAULT else str(n)) for t, n in pairs])
    ops: list[tuple[str, float | None]] = []
    for key, text in added:
        try:
            ops.append((key, float(text)))
        except ValueError:
            raise CliError(f"Invalid value {text} for quota {key}: not a number") from None
    ops += [(key, None) for key in deleted]
    with AdminClient(args.bootstrap_server, **admin_settings(args)) as admin:
        error = admin.alter_client_quotas([QuotaAlteration(entity, tuple(ops))]).get(entity)
    if isinstance(error, errors.DeltaBusError):
        raise error
