"""ACLs as a Kafka user manages them: `deltabus acls` (kafka-acls.sh's flags and output), against
a real controller and its gRPC door (no Spark: tests/cluster/controller_server.py). Over a whole
cluster: tests/cluster/test_acls.py."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from deltabus.cli.main import main
from deltabus.security.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclCreation,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from tests.cluster.controller_server import ControllerServer, serve

T, G, C, X = (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER,
              ResourceType.TRANSACTIONAL_ID)
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY


def acl(resource: ResourceType = T, name: str = "orders", pattern: PatternType = LIT,
        principal: str = "User:alice", host: str = "*", operation: Operation = Operation.READ,
        permission: Permission = ALLOW) -> AclBinding:
    return AclBinding(resource, name, pattern, principal, host, operation, permission)


@pytest.fixture
def controller_server(tmp_path: Path) -> Iterator[ControllerServer]:
    yield from serve(tmp_path)


@pytest.fixture
def acls(controller_server: ControllerServer, capsys: pytest.CaptureFixture[str]):
    """Runs `deltabus acls ...` in-process; returns (rc, stdout, stderr)."""
    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        rc = main(["acls", "--bootstrap-server", controller_server.address, *argv])
        out, err = capsys.readouterr()
        return rc, out, err
    return run


def _held(server: ControllerServer) -> list[AclBinding]:
    return sorted(server.controller.image().acls)


TOPIC = "ResourcePattern(resourceType=TOPIC, name=orders, patternType=LITERAL)"


def test_add_prints_what_it_adds_then_the_resources_acls(acls, controller_server) -> None:
    rc, out, err = acls("--add", "--allow-principal", "User:alice", "--operation", "Read",
                        "--operation", "Write", "--topic", "orders")
    assert (rc, err) == (0, "")
    assert out == (
        f"Adding ACLs for resource `{TOPIC}`: \n"
        " \t(principal=User:alice, host=*, operation=READ, permissionType=ALLOW)\n"
        "\t(principal=User:alice, host=*, operation=WRITE, permissionType=ALLOW) \n"
        "\n"
        f"Current ACLs for resource `{TOPIC}`: \n"
        " \t(principal=User:alice, host=*, operation=READ, permissionType=ALLOW)\n"
        "\t(principal=User:alice, host=*, operation=WRITE, permissionType=ALLOW) \n"
        "\n")
    assert _held(controller_server) == [acl(), acl(operation=Operation.WRITE)]


def test_deny_hosts_groups_clusters_and_prefixes(acls, controller_server) -> None:
    assert acls("--add", "--deny-principal", "User:mallory", "--deny-host", "10.0.0.9",
                "--deny-host", "10.0.0.8", "--operation", "All", "--group", "billing")[0] == 0
    assert acls("--add", "--allow-principal", "User:ops", "--operation", "AlterConfigs",
                "--operation", "DESCRIBE_CONFIGS", "--cluster")[0] == 0
    rc, out, _ = acls("--add", "--allow-principal", "User:*", "--operation", "describe",
                      "--topic", "public-", "--resource-pattern-type", "prefixed")
    assert rc == 0 and "name=public-, patternType=PREFIXED" in out
    assert _held(controller_server) == sorted([
        acl(G, "billing", principal="User:mallory", host="10.0.0.9", operation=Operation.ALL,
            permission=DENY),
        acl(G, "billing", principal="User:mallory", host="10.0.0.8", operation=Operation.ALL,
            permission=DENY),
        acl(C, CLUSTER_NAME, principal="User:ops", operation=Operation.ALTER_CONFIGS),
        acl(C, CLUSTER_NAME, principal="User:ops", operation=Operation.DESCRIBE_CONFIGS),
        acl(T, "public-", PRE, "User:*", operation=Operation.DESCRIBE)])


def test_producer_and_consumer_stand_for_kafkas_sets(acls, controller_server) -> None:
    assert acls("--add", "--allow-principal", "User:app", "--producer", "--idempotent",
                "--topic", "orders", "--transactional-id", "tx-1")[0] == 0
    assert acls("--add", "--allow-principal", "User:reader", "--consumer", "--topic", "orders",
                "--group", "billing")[0] == 0
    app, reader = "User:app", "User:reader"
    assert _held(controller_server) == sorted([
        acl(principal=app, operation=Operation.WRITE),
        acl(principal=app, operation=Operation.DESCRIBE),
        acl(principal=app, operation=Operation.CREATE),
        acl(X, "tx-1", principal=app, operation=Operation.WRITE),
        acl(X, "tx-1", principal=app, operation=Operation.DESCRIBE),
        acl(C, CLUSTER_NAME, principal=app, operation=Operation.IDEMPOTENT_WRITE),
        acl(principal=reader, operation=Operation.READ),
        acl(principal=reader, operation=Operation.DESCRIBE),
        acl(G, "billing", principal=reader, operation=Operation.READ)])


def test_list_all_by_resource_and_by_principal(acls, controller_server) -> None:
    controller_server.controller.create_acls([AclCreation.of(a) for a in (
        acl(), acl(principal="User:bob", operation=Operation.WRITE),
        acl(G, "billing", principal="User:bob"), acl(name="ord", pattern=PRE))])
    rc, out, _ = acls("--list")
    assert rc == 0 and out.count("Current ACLs for resource") == 3
    rc, out, _ = acls("--list", "--topic", "orders")
    assert out == (f"Current ACLs for resource `{TOPIC}`: \n"
                   " \t(principal=User:alice, host=*, operation=READ, permissionType=ALLOW)\n"
                   "\t(principal=User:bob, host=*, operation=WRITE, permissionType=ALLOW) \n\n")
    rc, out, _ = acls("--list", "--topic", "orders", "--resource-pattern-type", "match")
    assert "name=ord, patternType=PREFIXED" in out and "name=orders" in out
    rc, out, _ = acls("--list", "--principal", "User:bob")
    assert out.splitlines()[0] == "ACLs for principal `User:bob`"
    assert "User:alice" not in out and out.count("(principal=User:bob") == 2


def test_remove_with_force_without_principals_and_after_asking(
        acls, controller_server, monkeypatch: pytest.MonkeyPatch) -> None:
    controller_server.controller.create_acls([AclCreation.of(a) for a in (
        acl(), acl(operation=Operation.WRITE), acl(G, "billing"), acl(G, "audit"))])
    rc, out, _ = acls("--remove", "--allow-principal", "User:alice", "--operation", "Write",
                      "--topic", "orders", "--force")
    assert rc == 0 and "operation=WRITE" not in out and "operation=READ" in out
    assert acls("--remove", "--group", "billing", "--force")[0] == 0
    assert _held(controller_server) == sorted([acl(), acl(G, "audit")])

    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    rc, out, _ = acls("--remove", "--topic", "orders")
    assert rc == 0 and out.startswith(
        f"Are you sure you want to delete all ACLs for resource filter `{TOPIC}`? (y/n)\n")
    assert acl() in _held(controller_server)  # not confirmed: kept
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    rc, out, _ = acls("--remove", "--allow-principal", "User:alice", "--operation", "Read",
                      "--topic", "orders")
    assert rc == 0 and out.startswith(
        "Are you sure you want to remove ACLs: \n"
        " \t(principal=User:alice, host=*, operation=READ, permissionType=ALLOW) \n"
        f" from resource filter `{TOPIC}`? (y/n)\n")
    assert _held(controller_server) == [acl(G, "audit")]


@pytest.mark.parametrize(("argv", "message"), [
    ((), "Command must include exactly one action"),
    (("--list", "--allow-principal", "User:a"), "can't be used with option"),
    (("--add", "--producer", "--allow-principal", "User:a"), "With --producer you must"),
    (("--add", "--consumer", "--topic", "t", "--allow-principal", "User:a"),
     "With --consumer you must specify a --topic and a --group"),
    (("--add", "--idempotent", "--topic", "t"), "--idempotent option is only available"),
    (("--add", "--principal", "User:a", "--topic", "t"), "--principal option is only"),
    (("--add", "--allow-principal", "User:a"), "You must provide at least one resource"),
    (("--add", "--topic", "t"), "You must specify one of: --allow-principal"),
    (("--add", "--allow-principal", "alice", "--topic", "t"), "principalType:principalName"),
    (("--add", "--allow-principal", "User:a", "--operation", "Fly", "--topic", "t"),
     "Unknown operation name Fly"),
    (("--add", "--allow-principal", "User:a", "--operation", "Read", "--cluster"),
     "ResourceType CLUSTER only supports operations"),
    (("--add", "--allow-principal", "User:a", "--topic", "t", "--resource-pattern-type", "any"),
     "'--resource-pattern-type' value of 'ANY' is not valid when adding acls"),
    (("--add", "--allow-principal", "Group:a", "--topic", "t"), "Unknown principal `Group:a`"),
])
def test_bad_input_is_one_error_line(acls, controller_server, argv: tuple, message: str) -> None:
    rc, _, err = acls(*argv)
    assert rc == 1 and message in err
    assert err.startswith("Error: ") and err.count("\n") == 1
    assert _held(controller_server) == []
