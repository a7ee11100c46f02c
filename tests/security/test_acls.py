"""Kafka's authorization rules (StandardAuthorizer), on ACLs alone."""

from __future__ import annotations

import pytest

from deltabus import errors
from deltabus.security.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclBindingFilter,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from deltabus.security.principal import user

T, G, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY
ALICE, BOB = user("alice"), user("bob")


def acl(resource=T, name="orders", pattern=LIT, principal="User:alice", host="*",
        operation=Operation.READ, permission=ALLOW) -> AclBinding:
    return AclBinding(resource, name, pattern, principal, host, operation, permission)


def test_an_allow_lets_exactly_its_principal_operation_and_resource_through() -> None:
    auth = Authorizer([acl()])
    assert auth.authorize(ALICE, "10.0.0.1", Operation.READ, T, "orders")
    assert not auth.authorize(BOB, "10.0.0.1", Operation.READ, T, "orders")
    assert not auth.authorize(ALICE, "10.0.0.1", Operation.WRITE, T, "orders")
    assert not auth.authorize(ALICE, "10.0.0.1", Operation.READ, G, "orders")


def test_implied_operations_all_and_wildcards() -> None:
    auth = Authorizer([acl(operation=Operation.WRITE),
                       acl(name="*", principal="User:*", operation=Operation.ALTER_CONFIGS),
                       acl(resource=G, name="g", operation=Operation.ALL)])
    assert auth.authorize(ALICE, "h", Operation.DESCRIBE, T, "orders")  # WRITE implies it
    assert auth.authorize(BOB, "h", Operation.DESCRIBE_CONFIGS, T, "any-topic")
    assert auth.authorize(ALICE, "h", Operation.READ, G, "g")
    assert not auth.authorize(ALICE, "h", Operation.READ, T, "orders")  # WRITE is not READ


def test_deny_wins_and_prefixes_match_by_start() -> None:
    auth = Authorizer([acl(name="pay", pattern=PRE, operation=Operation.ALL),
                       acl(name="payroll", permission=DENY, host="10.0.0.9")])
    assert auth.authorize(ALICE, "10.0.0.1", Operation.READ, T, "payments")
    assert auth.authorize(ALICE, "10.0.0.1", Operation.READ, T, "payroll")
    assert not auth.authorize(ALICE, "10.0.0.9", Operation.READ, T, "payroll")
    assert not auth.authorize(ALICE, "10.0.0.1", Operation.READ, T, "orders")


def test_no_acl_on_a_resource_means_no_unless_allow_everyone_and_super_users_pass() -> None:
    assert not Authorizer([]).authorize(ALICE, "h", Operation.READ, T, "free")
    assert Authorizer([], allow_everyone_if_no_acl_found=True).authorize(
        ALICE, "h", Operation.READ, T, "free")
    # Once any ACL names the resource, allow.everyone no longer applies.
    assert not Authorizer([acl(name="free", principal="User:bob")],
                          allow_everyone_if_no_acl_found=True).authorize(
        ALICE, "h", Operation.READ, T, "free")
    assert Authorizer([acl(permission=DENY)], super_users=["User:alice"]).authorize(
        ALICE, "h", Operation.READ, T, "orders")


def test_filters_select_acls_as_describe_and_delete_do() -> None:
    acls = [acl(), acl(name="pay", pattern=PRE), acl(resource=C, name=CLUSTER_NAME,
                                                     operation=Operation.ALTER)]
    assert [a for a in acls if AclBindingFilter().matches(a)] == acls
    assert [a for a in acls if AclBindingFilter(resource_type=T, resource_name="pay",
                                                pattern_type=PRE).matches(a)] == [acls[1]]
    match = AclBindingFilter(resource_type=T, resource_name="payments",
                             pattern_type=PatternType.MATCH)
    assert [a for a in acls if match.matches(a)] == [acls[1]]
    assert [a for a in acls if AclBindingFilter(operation=Operation.ALTER).matches(a)] == [
        acls[2]]


def test_an_acl_names_exact_values() -> None:
    with pytest.raises(errors.InvalidRequestError):
        acl(resource=ResourceType.ANY)
    with pytest.raises(errors.InvalidRequestError):
        acl(resource=C, name="my-cluster")
    with pytest.raises(errors.InvalidRequestError):
        acl(principal="alice")
