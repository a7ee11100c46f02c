"""Access control lists, Kafka's model: who (principal, host) may do what (operation) to which
resource (a topic, group, the cluster, a transactional id; by literal name or name prefix).

`Authorizer.authorize` decides as Kafka's StandardAuthorizer does:
- a super user may do anything;
- a DENY that matches wins over every ALLOW;
- an ALLOW of the operation, of ALL, or of an operation that implies it (READ, WRITE, DELETE and
  ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS) lets the request through;
- when no ACL at all matches the resource, `allow.everyone.if.no.acl.found` decides (false by
  default, as Kafka's once an authorizer is configured).
An ACL matches a resource by literal name, by the literal wildcard `*`, or by prefix (PREFIXED);
a principal by equality or `User:*`; a host by equality or `*`.

Pure: the codes are Kafka's wire values, so both doors and the CLI share them. A code this
version does not know reads as UNKNOWN (`from_code`, as Kafka's fromCode), so a request carrying
one gets Kafka's INVALID_REQUEST for that ACL or filter instead of failing whole.

`AclCreation` is what CreateAcls carries, unchecked; `AclBinding` is a checked ACL, as the
metadata stores it; `AclBindingFilter` selects ACLs for DescribeAcls and DeleteAcls.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from deltabus import errors
from deltabus.security.principal import KafkaPrincipal

WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"


class ResourceType(enum.IntEnum):
    UNKNOWN = 0  # a code this version does not know: refused where it is read
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class PatternType(enum.IntEnum):
    UNKNOWN = 0  # a code this version does not know: refused where it is read
    ANY = 1  # filters only: literal or prefixed
    MATCH = 2  # filters only: every ACL that would apply to the named resource
    LITERAL = 3
    PREFIXED = 4


class Operation(enum.IntEnum):
    UNKNOWN = 0  # a code this version does not know: refused where it is read
    ANY = 1  # filters only
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


class Permission(enum.IntEnum):
    UNKNOWN = 0  # a code this version does not know: refused where it is read
    ANY = 1  # filters only
    DENY = 2
    ALLOW = 3


CLUSTER_NAME = "kafka-cluster"  # the one Cluster resource, as Kafka names it

Code = TypeVar("Code", ResourceType, PatternType, Operation, Permission)


def from_code(kind: type[Code], code: int) -> Code:
    """The member of a wire code; one this version does not know is UNKNOWN (Kafka's
    fromCode), refused by whoever checks the ACL or filter carrying it."""
    try:
        return kind(code)
    except ValueError:
        return kind.UNKNOWN

# An ALLOW of the key also allows these (Kafka's AclEntry.supportedOperations implications).
_IMPLIED = {
    Operation.DESCRIBE: {Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER},
    Operation.DESCRIBE_CONFIGS: {Operation.ALTER_CONFIGS},
}


@dataclass(frozen=True, order=True)
class AclBinding:
    """One ACL: Kafka's AclBinding (a resource pattern and an access control entry)."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str  # User:alice, or User:* for everyone
    host: str  # an address, or * for any
    operation: Operation
    permission: Permission

    def __post_init__(self) -> None:
        if self.resource_type in (ResourceType.ANY, ResourceType.UNKNOWN) or (
                self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED)) or (
                self.operation in (Operation.ANY, Operation.UNKNOWN)) or (
                self.permission not in (Permission.ALLOW, Permission.DENY)):
            raise errors.InvalidRequestError("an ACL names exact values: ANY and MATCH are for "
                                             "filters")
        if not self.resource_name:
            raise errors.InvalidRequestError("an ACL needs a resource name")
        if self.resource_type == ResourceType.CLUSTER and self.resource_name != CLUSTER_NAME:
            raise errors.InvalidRequestError(
                f"the cluster resource is named {CLUSTER_NAME!r}, not {self.resource_name!r}")
        KafkaPrincipal.parse(self.principal)
        if not self.host:
            raise errors.InvalidRequestError("an ACL needs a host (* for any)")

    def covers(self, resource_type: ResourceType, name: str) -> bool:
        """Whether this ACL applies to the named resource."""
        if self.resource_type != resource_type:
            return False
        if self.pattern_type == PatternType.PREFIXED:
            return name.startswith(self.resource_name)
        return self.resource_name in (name, WILDCARD)

    def applies_to(self, principal: KafkaPrincipal, host: str) -> bool:
        return (self.principal in (str(principal), WILDCARD_PRINCIPAL)
                and self.host in (host, WILDCARD))


@dataclass(frozen=True)
class AclCreation:
    """One ACL as CreateAcls carries it, not checked yet: the controller checks each
    (`cluster.acl_control`), so every creation gets its own answer, as in Kafka."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    @classmethod
    def of(cls, acl: AclBinding) -> AclCreation:
        return cls(acl.resource_type, acl.resource_name, acl.pattern_type, acl.principal,
                   acl.host, acl.operation, acl.permission)


@dataclass(frozen=True)
class AclBindingFilter:
    """Which ACLs DescribeAcls lists and DeleteAcls removes: None, or ANY, matches anything."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: Operation = Operation.ANY
    permission: Permission = Permission.ANY

    def check(self) -> None:
        """Kafka's refusal of a filter holding a code it does not know (INVALID_REQUEST)."""
        if (self.resource_type == ResourceType.UNKNOWN
                or self.pattern_type == PatternType.UNKNOWN):
            raise errors.InvalidRequestError("Unknown patternFilter.")
        if self.operation == Operation.UNKNOWN or self.permission == Permission.UNKNOWN:
            raise errors.InvalidRequestError("Unknown entryFilter.")

    def matches(self, acl: AclBinding) -> bool:
        if self.resource_type not in (ResourceType.ANY, acl.resource_type):
            return False
        if self.pattern_type == PatternType.MATCH:
            # Every ACL that would apply to the named resource: literal, wildcard or prefix.
            if self.resource_name is not None and not acl.covers(acl.resource_type,
                                                                   self.resource_name):
                return False
        else:
            if self.pattern_type not in (PatternType.ANY, acl.pattern_type):
                return False
            if self.resource_name is not None and self.resource_name != acl.resource_name:
                return False
        return (self.principal in (None, acl.principal) and self.host in (None, acl.host)
                and self.operation in (Operation.ANY, acl.operation)
                and self.permission in (Permission.ANY, acl.permission))


ResourcePattern = tuple[ResourceType, str, PatternType]


def by_resource(acls: Iterable[AclBinding]) -> dict[ResourcePattern, list[AclBinding]]:
    """ACLs grouped by resource pattern, as DescribeAcls answers and kafka-acls prints them;
    the groups and the ACLs in each are in the order given."""
    out: dict[ResourcePattern, list[AclBinding]] = {}
    for acl in acls:
        out.setdefault((acl.resource_type, acl.resource_name, acl.pattern_type), []).append(acl)
    return out


def describe_acls(acls: Iterable[AclBinding], acl_filter: AclBindingFilter) -> list[AclBinding]:
    """Kafka's DescribeAcls over a set of ACLs (the controller's, or a broker's image: Kafka's
    brokers answer it from their metadata), in their order. INVALID_REQUEST for a filter
    holding an unknown code."""
    acl_filter.check()
    return [acl for acl in acls if acl_filter.matches(acl)]


class Authorizer:
    """Decides requests against a set of ACLs (Kafka's StandardAuthorizer)."""

    def __init__(self, acls: Iterable[AclBinding], *, super_users: Iterable[str] = (),
                 allow_everyone_if_no_acl_found: bool = False) -> None:
        self._by_type: dict[ResourceType, list[AclBinding]] = {}
        for acl in acls:
            self._by_type.setdefault(acl.resource_type, []).append(acl)
        self._super_users = frozenset(super_users)
        self._allow_if_none = allow_everyone_if_no_acl_found

    def authorize(self, principal: KafkaPrincipal, host: str, operation: Operation,
                  resource_type: ResourceType, name: str) -> bool:
        if str(principal) in self._super_users:
            return True
        matching = [acl for acl in self._by_type.get(resource_type, ())
                    if acl.covers(resource_type, name)]
        if not matching:
            return self._allow_if_none
        mine = [acl for acl in matching if acl.applies_to(principal, host)]
        if any(acl.permission == Permission.DENY
               and acl.operation in (operation, Operation.ALL) for acl in mine):
            return False
        allowed = {operation, Operation.ALL} | _IMPLIED.get(operation, set())
        return any(acl.permission == Permission.ALLOW and acl.operation in allowed
                   for acl in mine)

    def allows_any(self, principal: KafkaPrincipal, host: str, operation: Operation,
                   resource_type: ResourceType) -> bool:
        """Whether some resource of the type is allowed `operation` for the caller (Kafka's
        authorizeByResourceType): an ALLOW that applies, on a name no DENY of the caller
        covers."""
        if str(principal) in self._super_users:
            return True
        mine = [acl for acl in self._by_type.get(resource_type, ())
                if acl.applies_to(principal, host)]
        denied = [acl for acl in mine if acl.permission == Permission.DENY
                  and acl.operation in (operation, Operation.ALL)]
        return any(acl.permission == Permission.ALLOW
                   and acl.operation in (operation, Operation.ALL)
                   and not any(d.covers(resource_type, acl.resource_name) for d in denied)
                   for acl in mine)


class AuthorizerCache:
    """The Authorizer over a server's current ACLs, built again only when they change (each
    metadata image holds them as one tuple)."""

    def __init__(self, *, super_users: Iterable[str] = (),
                 allow_everyone_if_no_acl_found: bool = False) -> None:
        self._super_users = tuple(super_users)
        self._allow_if_none = allow_everyone_if_no_acl_found
        self._for: tuple[AclBinding, ...] | None = None
        self._authorizer: Authorizer | None = None

    def get(self, acls: tuple[AclBinding, ...]) -> Authorizer:
        authorizer, built_for = self._authorizer, self._for
        if authorizer is None or built_for is not acls:
            authorizer = Authorizer(acls, super_users=self._super_users,
                                    allow_everyone_if_no_acl_found=self._allow_if_none)
            self._authorizer, self._for = authorizer, acls
        return authorizer
