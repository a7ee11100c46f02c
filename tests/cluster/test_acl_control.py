"""ACLs in the controller: CreateAcls and DeleteAcls checked as Kafka's controller checks them,
one result per creation or filter, records replayed into the state and its image, and
DescribeAcls from an image. Handlers change nothing; replaying their records does. No Spark."""

from __future__ import annotations

import copy
import json

import pytest

from deltabus import errors
from deltabus.cluster import acl_control
from deltabus.cluster.metadata_records import (
    AccessControlEntryRecord,
    RemoveAccessControlEntryRecord,
    from_stored,
    to_stored,
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
    describe_acls,
    from_code,
)

T, G, C, X = (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER,
              ResourceType.TRANSACTIONAL_ID)
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY


def acl(resource: ResourceType = T, name: str = "orders", pattern: PatternType = LIT,
        principal: str = "User:alice", host: str = "*", operation: Operation = Operation.READ,
        permission: Permission = ALLOW) -> AclBinding:
    return AclBinding(resource, name, pattern, principal, host, operation, permission)


def creation(**changes: object) -> AclCreation:
    fields = {"resource_type": T, "resource_name": "orders", "pattern_type": LIT,
              "principal": "User:alice", "host": "*", "operation": Operation.READ,
              "permission": ALLOW, **changes}
    return AclCreation(**fields)  # type: ignore[arg-type]


def _create(state: MetadataState, creations: list[AclCreation]) -> list:
    """Run the handler, check it changed nothing, then replay its records; the results."""
    before = copy.deepcopy(state)
    result = acl_control.create_acls(state, creations)
    assert state == before
    for record in result.records:
        state.replay(record)
    return result.response


def _delete(state: MetadataState, filters: list[AclBindingFilter]) -> list:
    before = copy.deepcopy(state)
    result = acl_control.delete_acls(state, filters)
    assert state == before
    for record in result.records:
        state.replay(record)
    return result.response


def test_created_acls_are_in_the_state_and_its_image_each_under_its_own_id() -> None:
    state = MetadataState()
    wanted = [acl(), acl(G, "billing"), acl(C, CLUSTER_NAME, operation=Operation.ALTER),
              acl(X, "tx-", PRE, "User:*", "10.0.0.1", Operation.WRITE, DENY)]
    assert _create(state, [AclCreation.of(a) for a in wanted]) == [None] * 4
    assert set(state.acls.values()) == set(wanted)
    assert len(set(state.acls)) == 4 and all(state.acl_ids[a] in state.acls for a in wanted)
    assert state.acls_image() == tuple(sorted(wanted))
    assert state.acls_image() is state.acls_image()  # the same tuple until an ACL changes


def test_an_existing_or_repeated_acl_is_a_success_that_writes_nothing() -> None:
    state = MetadataState()
    _create(state, [AclCreation.of(acl())])
    image = state.acls_image()
    result = acl_control.create_acls(state, [AclCreation.of(acl()), creation(host="10.0.0.1"),
                                             creation(host="10.0.0.1")])
    assert result.response == [None, None, None]
    assert [r.binding() for r in result.records] == [acl(host="10.0.0.1")]
    assert state.acls_image() is image  # a handler changes nothing


@pytest.mark.parametrize(("changes", "message"), [
    ({"resource_type": ResourceType.ANY}, "Invalid resourceType ANY"),
    ({"resource_type": ResourceType.UNKNOWN}, "Invalid resourceType UNKNOWN"),
    ({"pattern_type": PatternType.ANY}, "Invalid patternType ANY"),
    ({"pattern_type": PatternType.MATCH}, "Invalid patternType MATCH"),
    ({"operation": Operation.ANY}, "Invalid operation ANY"),
    ({"operation": from_code(Operation, 99)}, "Invalid operation UNKNOWN"),
    ({"permission": Permission.ANY}, "Invalid permissionType ANY"),
    ({"resource_name": ""}, "Resource name should not be empty"),
    ({"resource_type": C, "resource_name": "my-cluster"},
     "The only valid name for the CLUSTER resource is kafka-cluster"),
    ({"principal": "alice"}, "no colon"),
    ({"principal": "Group:admins"}, "Unknown principal `Group:admins`"),
    ({"principal": "User:"}, "Unknown principal"),
    ({"host": ""}, "Invalid empty host"),
])
def test_each_creation_gets_kafkas_invalid_request(changes: dict, message: str) -> None:
    state = MetadataState()
    results = _create(state, [creation(**changes), creation()])
    assert isinstance(results[0], errors.InvalidRequestError)
    assert message in results[0].message
    assert results[1] is None  # the others in the request are created
    assert list(state.acls.values()) == [acl()]


def test_delete_answers_each_filter_with_what_it_matched_and_removes_it_once() -> None:
    state = MetadataState()
    acls = [acl(), acl(operation=Operation.WRITE), acl(name="pay", pattern=PRE),
            acl(G, "billing", principal="User:bob")]
    _create(state, [AclCreation.of(a) for a in acls])
    results = _delete(state, [
        AclBindingFilter(resource_type=T, resource_name="orders", pattern_type=LIT),
        AclBindingFilter(operation=Operation.WRITE),  # matches one the first matched too
        AclBindingFilter(principal="User:carol"),
        AclBindingFilter(pattern_type=from_code(PatternType, 42))])
    assert results[0] == sorted(acls[:2]) and results[1] == [acls[1]] and results[2] == []
    assert isinstance(results[3], errors.InvalidRequestError)
    assert results[3].message == "Unknown patternFilter."
    assert sorted(state.acls.values()) == sorted(acls[2:])
    assert set(state.acl_ids) == set(acls[2:])


def test_a_match_filter_removes_every_acl_that_applies_to_a_resource() -> None:
    state = MetadataState()
    acls = [acl(name="payments"), acl(name="pay", pattern=PRE), acl(name="*"),
            acl(name="orders")]
    _create(state, [AclCreation.of(a) for a in acls])
    results = _delete(state, [AclBindingFilter(resource_type=T, resource_name="payments",
                                               pattern_type=PatternType.MATCH)])
    assert results == [sorted(acls[:3])]
    assert list(state.acls.values()) == [acls[3]]


def test_describe_reads_an_image_and_refuses_unknown_filters() -> None:
    acls = (acl(), acl(G, "billing"), acl(operation=Operation.WRITE, permission=DENY))
    assert describe_acls(acls, AclBindingFilter()) == list(acls)
    assert describe_acls(acls, AclBindingFilter(permission=DENY)) == [acls[2]]
    assert describe_acls(acls, AclBindingFilter(resource_type=G)) == [acls[1]]
    with pytest.raises(errors.InvalidRequestError, match="Unknown entryFilter"):
        describe_acls(acls, AclBindingFilter(operation=from_code(Operation, 77)))


def test_requests_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(acl_control.cfg, "ACL_RECORDS_PER_REQUEST_MAX", 2)
    state = MetadataState()
    results = _create(state, [creation(host=f"10.0.0.{i}") for i in range(3)])
    assert results[:2] == [None, None] and isinstance(results[2], errors.InvalidRequestError)
    _create(state, [creation(host="10.0.0.2")])
    results = _delete(state, [AclBindingFilter(), AclBindingFilter(host="10.0.0.0")])
    assert all(isinstance(r, errors.InvalidRequestError) for r in results)
    assert len(state.acls) == 3  # nothing removed


def test_records_keep_kafkas_codes_in_the_log_and_replay_checks_invariants() -> None:
    record = AccessControlEntryRecord.of("id-1", acl(X, "tx-", PRE, "User:*", "10.0.0.1",
                                                     Operation.WRITE, DENY))
    stored = to_stored(record)
    assert stored == {"type": "access_control_entry", "id": "id-1", "resource_type": 5,
                      "resource_name": "tx-", "pattern_type": 4, "principal": "User:*",
                      "host": "10.0.0.1", "operation": 4, "permission": 2}
    assert from_stored(json.loads(json.dumps(stored))) == record
    assert to_stored(RemoveAccessControlEntryRecord("id-1")) == {
        "type": "remove_access_control_entry", "id": "id-1"}

    state = MetadataState()
    state.replay(stored)
    with pytest.raises(ValueError):  # the same ACL twice is a bug, as KRaft's replay says
        state.replay(AccessControlEntryRecord.of("id-2", record.binding()))
    state.replay(RemoveAccessControlEntryRecord("id-1"))
    assert state.acls == {} and state.acl_ids == {} and state.acls_image() == ()
    with pytest.raises(ValueError):
        state.replay(RemoveAccessControlEntryRecord("id-1"))
