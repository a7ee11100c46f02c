"""Kafka's ACL APIs over the same handler calls as gRPC's: DescribeAcls (29), CreateAcls (30)
and DeleteAcls (31), as kafka-acls.sh, confluent-kafka's and kafka-python's admin clients send
them (v1 to v3; v0, without pattern types, is long gone from Kafka).

A broker forwards CreateAcls and DeleteAcls to the controller on the caller's behalf and answers
DescribeAcls from its own metadata, as a KRaft broker does. The checks (`KafkaApis._refusal`) are
Kafka's: ALTER on the cluster to create or delete, DESCRIBE to describe; a refusal answers every
creation or filter, or the whole DescribeAcls, with CLUSTER_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kio.schema.errors import ErrorCode

from deltabus import errors
from deltabus.rpc.access import current_access
from deltabus.rpc.admin_requests import AdminRequests
from deltabus.rpc.kafka.frames import NO_TIME, error_code, load_response_schema, make, nested
from deltabus.security.acls import (
    AclBinding,
    AclBindingFilter,
    AclCreation,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    by_resource,
    from_code,
)

DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31
SUPPORTED: dict[int, tuple[int, int]] = {
    DESCRIBE_ACLS: (1, 3),
    CREATE_ACLS: (1, 3),
    DELETE_ACLS: (1, 3),
}


def _message(error: errors.DeltaBusError | None) -> str | None:
    return error.message if error is not None else None


def _filter(f: Any) -> AclBindingFilter:
    """A DescribeAcls request or a DeleteAcls filter (the same fields); null strings match
    any, unknown codes read as UNKNOWN (refused with INVALID_REQUEST)."""
    return AclBindingFilter(
        from_code(ResourceType, f.resource_type_filter), f.resource_name_filter,
        from_code(PatternType, f.pattern_type_filter), f.principal_filter, f.host_filter,
        from_code(Operation, f.operation), from_code(Permission, f.permission_type))


class KafkaAclApis:
    def __init__(self, requests: AdminRequests) -> None:
        self._requests = requests
        self.apis = {DESCRIBE_ACLS: self.describe_acls, CREATE_ACLS: self.create_acls,
                     DELETE_ACLS: self.delete_acls}

    def describe_acls(self, version: int, request: Any,
                      refused: errors.DeltaBusError | None = None) -> Any:
        """The ACLs the filter matches, grouped by resource pattern."""
        cls = load_response_schema(DESCRIBE_ACLS, version)
        resource_cls, acl_cls = (nested(cls, n) for n in ("DescribeAclsResource",
                                                          "AclDescription"))
        acls: list[AclBinding] = []
        if refused is None:
            try:
                acls = self._requests.describe_acls(current_access(), _filter(request))
            except errors.InvalidRequestError as e:
                refused = e
        return make(cls, throttle_time=NO_TIME, error_code=error_code(refused),
                    error_message=_message(refused), resources=tuple(
                        make(resource_cls, resource_type=int(t), resource_name=name,
                             pattern_type=int(pattern), acls=tuple(
                                 make(acl_cls, principal=a.principal, host=a.host,
                                      operation=int(a.operation),
                                      permission_type=int(a.permission)) for a in entries))
                        for (t, name, pattern), entries in by_resource(acls).items()))

    def create_acls(self, version: int, request: Any,
                    refused: errors.DeltaBusError | None = None) -> Any:
        """One result per creation, in order; the controller checks each."""
        cls = load_response_schema(CREATE_ACLS, version)
        result_cls = nested(cls, "AclCreationResult")
        creations = [AclCreation(
            from_code(ResourceType, c.resource_type), c.resource_name,
            from_code(PatternType, c.resource_pattern_type), c.principal, c.host,
            from_code(Operation, c.operation), from_code(Permission, c.permission_type))
            for c in request.creations]
        results: Sequence[errors.DeltaBusError | None] = [refused for _ in creations]
        if refused is None and creations:
            try:
                results = self._requests.create_acls(current_access(), creations)
            except errors.DeltaBusError as e:  # the controller could not be asked
                results = [e for _ in creations]
        return make(cls, throttle_time=NO_TIME, results=tuple(
            make(result_cls, error_code=error_code(e), error_message=_message(e))
            for e in results))

    def delete_acls(self, version: int, request: Any,
                    refused: errors.DeltaBusError | None = None) -> Any:
        """Per filter, the ACLs it matched (all removed), or its error."""
        cls = load_response_schema(DELETE_ACLS, version)
        result_cls, matching_cls = (nested(cls, n) for n in ("DeleteAclsFilterResult",
                                                             "DeleteAclsMatchingAcl"))
        filters = [_filter(f) for f in request.filters]
        results: Sequence[list[AclBinding] | errors.DeltaBusError] = [
            refused for _ in filters] if refused is not None else []
        if refused is None and filters:
            try:
                results = self._requests.delete_acls(current_access(), filters)
            except errors.DeltaBusError as e:
                results = [e for _ in filters]
        out = []
        for r in results:
            error = r if isinstance(r, errors.DeltaBusError) else None
            matched = () if isinstance(r, errors.DeltaBusError) else r
            out.append(make(
                result_cls, error_code=error_code(error), error_message=_message(error),
                matching_acls=tuple(make(
                    matching_cls, error_code=ErrorCode.none, error_message=None,
                    resource_type=int(a.resource_type), resource_name=a.resource_name,
                    pattern_type=int(a.pattern_type), principal=a.principal, host=a.host,
                    operation=int(a.operation), permission_type=int(a.permission))
                    for a in matched)))
        return make(cls, throttle_time=NO_TIME, filter_results=tuple(out))
