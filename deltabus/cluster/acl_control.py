"""ACLs (KRaft's AclControlManager). Runs in the driver, inside the controller.

`create_acls` and `delete_acls` are handlers: they check each creation or filter as Kafka's
controller does and return the records and one result per creation or filter, changing nothing
themselves. Creating an ACL that exists (or twice in one request) is a success that writes
nothing; a filter's result lists every ACL it matched, and an ACL two filters match is removed
once. DescribeAcls needs no handler: it reads an image (`acls.describe_acls`).

Deliberately unlike Kafka, which answers SECURITY_DISABLED without an authorizer, ACLs are kept
whether or not the cluster authorizes requests, so they can be set up before the authorizer is
switched on.

Invariants: every ACL written is one `AclBinding` accepts, of a `User` principal, with a new
unique id; no request writes more than `ACL_RECORDS_PER_REQUEST_MAX` records.
Not thread-safe: the controller holds its lock around every call.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.metadata_records import (
    AccessControlEntryRecord,
    ControllerResult,
    MetadataRecord,
    RemoveAccessControlEntryRecord,
)
from deltabus.cluster.metadata_state import MetadataState
from deltabus.security.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclBindingFilter,
    AclCreation,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

USER_TYPE = "User"  # the one principal type deltabus's listeners authenticate

CreateResults = list[errors.DeltaBusError | None]  # per creation: None (done) or why not
DeleteResults = list[list[AclBinding] | errors.DeltaBusError]  # per filter: what it removed


def new_acl_id() -> str:
    return str(uuid.uuid4())


def create_acls(state: MetadataState, creations: Sequence[AclCreation],
                new_id: Callable[[], str] = new_acl_id) -> ControllerResult[CreateResults]:
    """Kafka's CreateAcls: a record for each new ACL, a result per creation (in order)."""
    results: CreateResults = []
    created: dict[AclBinding, str] = {}
    ids: set[str] = set()
    for creation in creations:
        try:
            acl = checked(creation)
            if acl not in state.acl_ids and acl not in created:
                if len(created) >= cfg.ACL_RECORDS_PER_REQUEST_MAX:
                    raise errors.InvalidRequestError(
                        f"A request may create at most {cfg.ACL_RECORDS_PER_REQUEST_MAX} ACLs")
                acl_id = new_id()
                if acl_id in state.acls or acl_id in ids:
                    raise AssertionError(f"ACL id {acl_id} was handed out twice")
                created[acl] = acl_id
                ids.add(acl_id)
            results.append(None)
        except errors.DeltaBusError as e:
            results.append(e)
    records: list[MetadataRecord] = [AccessControlEntryRecord.of(acl_id, acl)
                                     for acl, acl_id in created.items()]
    return ControllerResult(records, results)


def delete_acls(state: MetadataState, filters: Sequence[AclBindingFilter]
                ) -> ControllerResult[DeleteResults]:
    """Kafka's DeleteAcls: per filter, the ACLs it matched (all removed) or why it was
    refused. A request that would remove more than the limit is refused whole."""
    results: DeleteResults = []
    removed: dict[str, AclBinding] = {}
    for acl_filter in filters:
        try:
            acl_filter.check()
        except errors.DeltaBusError as e:
            results.append(e)
            continue
        matched = {acl_id: acl for acl_id, acl in state.acls.items() if acl_filter.matches(acl)}
        removed.update(matched)
        results.append(sorted(matched.values()))
    if len(removed) > cfg.ACL_RECORDS_PER_REQUEST_MAX:
        error = errors.InvalidRequestError(
            f"The filters match {len(removed)} ACLs; a request may delete at most "
            f"{cfg.ACL_RECORDS_PER_REQUEST_MAX}")
        return ControllerResult([], [error for _ in filters])
    return ControllerResult([RemoveAccessControlEntryRecord(acl_id) for acl_id in removed],
                            results)


def checked(creation: AclCreation) -> AclBinding:
    """The ACL a creation asks for, checked as Kafka's broker and controller check it
    (INVALID_REQUEST with Kafka's message)."""
    if creation.resource_type in (ResourceType.ANY, ResourceType.UNKNOWN):
        raise errors.InvalidRequestError(f"Invalid resourceType {creation.resource_type.name}")
    if creation.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise errors.InvalidRequestError(f"Invalid patternType {creation.pattern_type.name}")
    if creation.operation in (Operation.ANY, Operation.UNKNOWN):
        raise errors.InvalidRequestError(f"Invalid operation {creation.operation.name}")
    if creation.permission not in (Permission.ALLOW, Permission.DENY):
        raise errors.InvalidRequestError(f"Invalid permissionType {creation.permission.name}")
    if not creation.resource_name:
        raise errors.InvalidRequestError("Resource name should not be empty")
    if creation.resource_type == ResourceType.CLUSTER and creation.resource_name != CLUSTER_NAME:
        raise errors.InvalidRequestError(
            f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
    kind, colon, name = creation.principal.partition(":")
    if not colon:
        raise errors.InvalidRequestError(
            f"Could not parse principal from `{creation.principal}` (no colon is present "
            f"separating the principal type from the principal name)")
    if kind != USER_TYPE or not name:
        raise errors.InvalidRequestError(
            f"Unknown principal `{creation.principal}`: ACLs name {USER_TYPE} principals "
            f"({USER_TYPE}:alice, or {USER_TYPE}:* for every user)")
    if not creation.host:
        raise errors.InvalidRequestError("Invalid empty host: give an address, or * for any")
    return AclBinding(creation.resource_type, creation.resource_name, creation.pattern_type,
                      creation.principal, creation.host, creation.operation,
                      creation.permission)
