"""Topic configs as a Kafka user changes them: `deltabus configs` (kafka-configs.sh) and the
AdminClient, against the shared cluster; the brokers apply a change before it returns."""

from __future__ import annotations

from typing import Any

import pytest

from deltabus import AdminClient, AlterConfigOp, NewTopic, Producer, errors
from deltabus.config import APPEND, DELETE, SET
from tests.cli.conftest import Cli


def test_describe_and_alter_topic_configs(cli: Cli, cluster: Any, topic_name: str) -> None:
    assert cli("topics", "--create", "--topic", topic_name, "--config",
               "retention.ms=60000")[0] == 0
    rc, out, _ = cli("configs", "--describe", "--entity-type", "topics", "--entity-name",
                     topic_name)
    assert (rc, out) == (0, f"Dynamic configs for topic {topic_name} are:\n"
                            "  retention.ms=60000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:"
                            "retention.ms=60000, DEFAULT_CONFIG:log.retention.ms=604800000}\n")

    rc, out, _ = cli("configs", "--alter", "--topic", topic_name, "--add-config",
                     "retention.bytes=1048576,cleanup.policy=[compact,delete]",
                     "--delete-config", "retention.ms")
    assert (rc, out) == (0, f"Completed updating config for topic {topic_name}.\n")
    rc, out, _ = cli("configs", "--describe", "--topic", topic_name)
    assert out.splitlines()[1:] == [
        "  cleanup.policy=compact,delete sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:"
        "cleanup.policy=compact,delete, DEFAULT_CONFIG:log.cleanup.policy=delete}",
        "  retention.bytes=1048576 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:"
        "retention.bytes=1048576, DEFAULT_CONFIG:log.retention.bytes=-1}"]

    rc, out, _ = cli("configs", "--describe", "--all", "--topic", topic_name)
    lines = out.splitlines()
    assert lines[0] == f"All configs for topic {topic_name} are:"
    assert ("  retention.ms=604800000 sensitive=false synonyms={DEFAULT_CONFIG:"
            "log.retention.ms=604800000}") in lines
    assert any(line.startswith("  min.insync.replicas=1 ") for line in lines)
    # kafka-topics --describe shows the overrides too
    rc, out, _ = cli("topics", "--describe", "--topic", topic_name)
    assert out.splitlines()[0].endswith(
        "Configs: cleanup.policy=compact,delete,retention.bytes=1048576")
    # every topic, when no name is given
    rc, out, _ = cli("configs", "--describe", "--entity-type", "topics")
    assert f"Dynamic configs for topic {topic_name} are:" in out.splitlines()


@pytest.mark.parametrize(("argv", "message"), [
    (["--alter", "--add-config", "retention.ms=soon"],
     "Invalid value soon for configuration retention.ms: Not a number of type LONG"),
    (["--alter", "--add-config", "retention.ms=-5"],
     "Invalid value -5 for configuration retention.ms: Value must be at least -1"),
    (["--alter", "--add-config", "retention=1"], "Unknown topic config name: retention"),
    (["--alter", "--add-config", "retention.ms"], 'must be in the format "key=val"'),
    (["--alter", "--add-config", "min.insync.replicas=2,retention.ms=x"],
     "retention.ms: Not a number of type LONG"),
    (["--alter"], "At least one of --add-config or --delete-config must be specified"),
    (["--describe", "--add-config", "retention.ms=1"], "can only be used with --alter"),
], ids=["not-a-number", "below-minimum", "unknown-key", "no-value", "one-bad-of-two",
        "nothing-to-alter", "add-with-describe"])
def test_bad_config_changes_are_refused_and_change_nothing(cli: Cli, topic_name: str,
                                                           argv: list[str], message: str) -> None:
    assert cli("topics", "--create", "--topic", topic_name, "--config",
               "retention.ms=60000")[0] == 0
    rc, out, err = cli("configs", "--topic", topic_name, *argv)
    assert rc == 1 and out == "" and message in err and err.count("\n") == 1, err
    assert err.count("INVALID_CONFIG") <= 1, err  # the code named once
    rc, out, _ = cli("configs", "--describe", "--topic", topic_name)
    assert out.splitlines()[1:] == [
        "  retention.ms=60000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=60000, "
        "DEFAULT_CONFIG:log.retention.ms=604800000}"]


def test_configs_of_a_missing_topic_or_a_broker(cli: Cli) -> None:
    rc, _, err = cli("configs", "--describe", "--topic", "no-such-topic")
    assert rc == 1 and "Topic 'no-such-topic' does not exist." in err
    rc, _, err = cli("configs", "--alter", "--topic", "no-such-topic", "--add-config",
                     "retention.ms=1")
    assert rc == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in err
    rc, _, err = cli("configs", "--describe", "--entity-type", "brokers", "--entity-name", "0")
    assert rc == 1 and "only topics and groups have dynamic configs" in err


def test_an_altered_config_takes_effect_on_the_next_produce(cluster: Any,
                                                            topic_name: str) -> None:
    """max.message.bytes lowered through the admin API: the brokers refuse a larger batch at once
    (the alter returns after they applied it), and accept it again after the override goes."""
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1)])
        admin.incremental_alter_configs(
            {topic_name: [AlterConfigOp("max.message.bytes", SET, "1000"),
                          AlterConfigOp("cleanup.policy", APPEND, "compact")]})
        entries = {e.name: e for e in admin.describe_configs([topic_name])[topic_name]}
        assert entries["max.message.bytes"].value == "1000"
        assert entries["cleanup.policy"].value == "delete,compact"
        with Producer(cluster.bootstrap_servers) as producer:
            with pytest.raises(errors.MessageTooLargeError):
                producer.send(topic_name, b"x" * 5000).get(30)
        admin.incremental_alter_configs(
            {topic_name: [AlterConfigOp("max.message.bytes", DELETE)]})
        with Producer(cluster.bootstrap_servers) as producer:
            assert producer.send(topic_name, b"x" * 5000, key=b"k").get(30).offset == 0
        with pytest.raises(errors.InvalidConfigError, match="max.message.bytes"):
            admin.incremental_alter_configs(
                {topic_name: [AlterConfigOp("max.message.bytes", SET, "0")]},
                validate_only=True)


def test_a_broker_resource_on_the_wire_is_refused_and_the_topic_beside_it_answered(
        cluster: Any, topic_name: str) -> None:
    """Kafka's clients may ask for broker configs: each such resource gets INVALID_REQUEST,
    the topics in the same request their configs."""
    from deltabus.client.cluster_client import ClusterClient
    from deltabus.rpc.v1 import deltabus_pb2 as pb

    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1)])
    client = ClusterClient(cluster.bootstrap_servers)
    try:
        response = client.call_any("DescribeConfigs", pb.DescribeConfigsRequest(resources=[
            pb.DescribeConfigsResource(resource_type=4, resource_name="0"),
            pb.DescribeConfigsResource(resource_type=2, resource_name=topic_name,
                                       configuration_keys=["retention.ms"])]))
    finally:
        client.close()
    by_name = {r.resource_name: r for r in response.results}
    assert by_name["0"].error_code == errors.InvalidRequestError.code
    assert "only topics and groups have dynamic configs" in by_name["0"].error_message
    assert [(c.name, c.value) for c in by_name[topic_name].configs] == [
        ("retention.ms", "604800000")]
