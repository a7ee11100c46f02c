"""ACLs over a running cluster: created and deleted through deltabus's AdminClient, the CLI and
confluent-kafka's AdminClient (librdkafka over the Kafka door, unmodified), forwarded by the
brokers to the controller, and held by every broker once the call returns: each broker answers
DescribeAcls from its own metadata, as a KRaft broker does (the ACLs its authorizer reads). A
controller started again on the cluster's root replays them.

The shared cluster runs without an authorizer, so these ACLs decide nothing here; each test
names its own principal and removes what it made. The checks, the refusals and the restart
without Spark: tests/cluster/test_acl_store.py, tests/cli/test_acl_command.py.
"""

from __future__ import annotations

import pytest
from confluent_kafka import admin as ck

from deltabus import AdminClient, errors
from deltabus.cli.main import main
from deltabus.cluster.controller import Controller
from deltabus.security.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclBindingFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

T, G, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED


def _broker_addresses(cluster) -> list[str]:
    return [b.address for b in cluster.controller.image().brokers]


def _held_by_every_broker(cluster, principal: str) -> set[tuple[AclBinding, ...]]:
    """What each broker answers from its own metadata (one answer per broker)."""
    answers = set()
    for address in _broker_addresses(cluster):
        with AdminClient(address) as admin:
            answers.add(tuple(admin.describe_acls(AclBindingFilter(principal=principal))))
    return answers


def test_admin_client_and_cli_manage_acls_every_broker_holds(
        cluster, capsys: pytest.CaptureFixture[str]) -> None:
    who = "User:acl-test-henry"
    wanted = [
        AclBinding(T, "henrys-orders", LIT, who, "*", Operation.WRITE, Permission.ALLOW),
        AclBinding(G, "henrys-", PRE, who, "10.0.0.1", Operation.READ, Permission.DENY)]
    broker = _broker_addresses(cluster)[0]
    with AdminClient(broker) as admin:  # a broker forwards it to the controller
        on_cluster = AclBinding(C, CLUSTER_NAME, LIT, who, "*", Operation.ALTER,
                                Permission.ALLOW)
        results = admin.create_acls([*wanted, on_cluster])
    assert results == {a: None for a in [*wanted, on_cluster]}
    held = tuple(sorted([*wanted, on_cluster]))
    assert _held_by_every_broker(cluster, who) == {held}  # returned: every broker holds them

    assert main(["acls", "--bootstrap-server", broker, "--add", "--allow-principal", who,
                 "--consumer", "--topic", "henrys-orders", "--group", "henrys-group"]) == 0
    out = capsys.readouterr().out
    assert ("Current ACLs for resource `ResourcePattern(resourceType=GROUP, "
            "name=henrys-group, patternType=LITERAL)`: \n \t(principal=User:acl-test-henry, "
            "host=*, operation=READ, permissionType=ALLOW) \n") in out
    (answer,) = _held_by_every_broker(cluster, who)
    assert len(answer) == 6  # + READ, DESCRIBE on the topic and READ on the group

    assert main(["acls", "--bootstrap-server", cluster.bootstrap_servers, "--remove", "--topic",
                 "henrys-orders", "--force"]) == 0
    (answer,) = _held_by_every_broker(cluster, who)
    assert {a.resource_type for a in answer} == {G, C}

    # A controller started on the same root replays them, ids and all.
    replayed = Controller(cluster.config)
    assert replayed.describe_acls(AclBindingFilter(principal=who)) == list(answer)
    assert ({i: a for i, a in replayed._state.acls.items() if a.principal == who}
            == {i: a for i, a in cluster.controller._state.acls.items() if a.principal == who})

    with AdminClient(cluster.bootstrap_servers) as admin:
        (deleted,) = admin.delete_acls([AclBindingFilter(principal=who)]).values()
    assert deleted == list(answer)
    assert _held_by_every_broker(cluster, who) == {()}


def test_confluent_kafka_admin_client_over_the_kafka_door(cluster) -> None:
    who = "User:acl-test-ida"
    admin = ck.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap_servers})
    wanted = [
        ck.AclBinding(ck.ResourceType.TOPIC, "idas-", ck.ResourcePatternType.PREFIXED, who,
                      "*", ck.AclOperation.READ, ck.AclPermissionType.ALLOW),
        ck.AclBinding(ck.ResourceType.GROUP, "idas-group", ck.ResourcePatternType.LITERAL, who,
                      "*", ck.AclOperation.READ, ck.AclPermissionType.ALLOW)]
    bad = ck.AclBinding(ck.ResourceType.TOPIC, "idas-topic", ck.ResourcePatternType.LITERAL,
                        "Group:idas-team", "*", ck.AclOperation.READ, ck.AclPermissionType.ALLOW)
    futures = admin.create_acls([*wanted, bad])
    assert [futures[a].result(60) for a in wanted] == [None, None]
    with pytest.raises(ck.KafkaException, match="Unknown principal"):
        futures[bad].result(60)
    expected = (AclBinding(T, "idas-", PRE, who, "*", Operation.READ, Permission.ALLOW),
                AclBinding(G, "idas-group", LIT, who, "*", Operation.READ, Permission.ALLOW))
    assert _held_by_every_broker(cluster, who) == {tuple(sorted(expected))}

    mine = ck.AclBindingFilter(ck.ResourceType.ANY, None, ck.ResourcePatternType.ANY, who, None,
                               ck.AclOperation.ANY, ck.AclPermissionType.ANY)
    described = admin.describe_acls(mine).result(60)
    assert sorted((b.restype, b.name, b.resource_pattern_type) for b in described) == sorted([
        (ck.ResourceType.TOPIC, "idas-", ck.ResourcePatternType.PREFIXED),
        (ck.ResourceType.GROUP, "idas-group", ck.ResourcePatternType.LITERAL)])

    topic_match = ck.AclBindingFilter(
        ck.ResourceType.TOPIC, "idas-orders", ck.ResourcePatternType.MATCH, who, None,
        ck.AclOperation.ANY, ck.AclPermissionType.ANY)
    deleted = admin.delete_acls([topic_match])[topic_match].result(60)
    assert [(b.name, b.resource_pattern_type) for b in deleted] == [
        ("idas-", ck.ResourcePatternType.PREFIXED)]
    assert _held_by_every_broker(cluster, who) == {(expected[1],)}
    admin.delete_acls([mine])[mine].result(60)
    assert _held_by_every_broker(cluster, who) == {()}
    with AdminClient(cluster.bootstrap_servers) as ours:
        with pytest.raises(errors.InvalidRequestError):
            ours.describe_acls(AclBindingFilter(pattern_type=PatternType.UNKNOWN))
