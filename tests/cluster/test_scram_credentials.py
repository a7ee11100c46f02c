"""Users' SCRAM credentials over a running cluster: set through deltabus's AdminClient, the CLI
and confluent-kafka's AdminClient (librdkafka over the Kafka door, unmodified), forwarded by the
brokers to the controller, and held by every broker once the call returns: each broker answers
DescribeUserScramCredentials from its own metadata, as a KRaft broker does, the same credentials
its `scram_credential` lookup (the doors' authenticators) reads. The password is in no file of the
metadata log and in no log line of the driver or the brokers.

The keys themselves, the restart and the refusals: tests/cluster/test_scram_store.py (no Spark).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient as KafkaAdminClient
from confluent_kafka.admin import ScramCredentialInfo as KafkaScramCredentialInfo
from confluent_kafka.admin import ScramMechanism
from confluent_kafka.admin import UserScramCredentialDeletion as KafkaDeletion
from confluent_kafka.admin import UserScramCredentialUpsertion as KafkaUpsertion

from deltabus import (
    AdminClient,
    ScramCredentialInfo,
    UserScramCredentialDeletion,
    UserScramCredentialsDescription,
    UserScramCredentialUpsertion,
    errors,
)
from deltabus.cli.main import main
from deltabus.log_tables.layout import metadata_path
from deltabus.security.scram import verify_password

SHA256, SHA512 = "SCRAM-SHA-256", "SCRAM-SHA-512"


def _broker_addresses(cluster) -> list[str]:
    return [b.address for b in cluster.controller.image().brokers]


def _described_by_every_broker(cluster, user: str) -> set:
    """What each broker answers from its own metadata (one answer per broker)."""
    answers = set()
    for address in _broker_addresses(cluster):
        with AdminClient(address) as admin:
            answers.add(admin.describe_user_scram_credentials([user])[user])
    return answers


def test_admin_client_and_cli_set_credentials_every_broker_holds(
        cluster, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """capfd holds what the broker tasks log too (their stderr is this process's)."""
    caplog.set_level(logging.DEBUG)
    password = "frank-password-in-no-file-or-log"
    broker = _broker_addresses(cluster)[0]
    with AdminClient(broker) as admin:  # a broker forwards it to the controller
        assert admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
            "frank", ScramCredentialInfo(SHA512, 8192), password)]) == {"frank": None}
    # Returned: every broker holds it already.
    assert _described_by_every_broker(cluster, "frank") == {UserScramCredentialsDescription(
        "frank", (ScramCredentialInfo(SHA512, 8192),))}
    assert verify_password(cluster.controller.scram_credential("frank", SHA512), password)

    logs = "".join(capfd.readouterr())
    assert main(["configs", "--bootstrap-server", broker, "--alter", "--add-config",
                 f"SCRAM-SHA-256=[password={password}]", "--delete-config", "SCRAM-SHA-512",
                 "--entity-type", "users", "--entity-name", "frank"]) == 0
    assert main(["configs", "--bootstrap-server", broker, "--describe", "--entity-type",
                 "users", "--entity-name", "frank"]) == 0
    out, err = capfd.readouterr()
    logs += err
    assert out.splitlines() == [
        "Completed updating config for user frank.",
        "SCRAM credential configs for user-principal 'frank' are SCRAM-SHA-256=iterations=4096"]
    assert _described_by_every_broker(cluster, "frank") == {UserScramCredentialsDescription(
        "frank", (ScramCredentialInfo(SHA256, 4096),))}

    with AdminClient(cluster.bootstrap_servers) as admin:
        assert admin.alter_user_scram_credentials(
            [UserScramCredentialDeletion("frank", SHA256)]) == {"frank": None}
    gone = _described_by_every_broker(cluster, "frank")
    assert len(gone) == len(_broker_addresses(cluster))  # one error per broker: all missing
    assert all(isinstance(e, errors.ResourceNotFoundError) for e in gone)

    stored = b"".join(p.read_bytes() for p in Path(metadata_path(cluster.config.root)).rglob("*")
                      if p.is_file())
    assert b"frank" in stored and password.encode() not in stored
    logs += "".join(capfd.readouterr()) + caplog.text
    assert "frank" in caplog.text and password not in logs


def test_confluent_kafka_admin_client_over_the_kafka_door(cluster) -> None:
    admin = KafkaAdminClient({"bootstrap.servers": cluster.kafka_bootstrap_servers})
    futures = admin.alter_user_scram_credentials([
        KafkaUpsertion("grace", KafkaScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192),
                       b"grace-secret"),
        KafkaUpsertion("grace", KafkaScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
                       b"grace-other")])
    assert futures["grace"].result(60) is None
    # librdkafka salted the password itself: the controller's credential checks it.
    assert verify_password(cluster.controller.scram_credential("grace", SHA256), "grace-secret")
    assert verify_password(cluster.controller.scram_credential("grace", SHA512), "grace-other")

    described = admin.describe_user_scram_credentials(["grace"])["grace"].result(60)
    assert described.user == "grace"
    assert sorted((i.mechanism, i.iterations) for i in described.scram_credential_infos) == [
        (ScramMechanism.SCRAM_SHA_256, 8192), (ScramMechanism.SCRAM_SHA_512, 4096)]
    everyone = admin.describe_user_scram_credentials().result(60)
    assert "grace" in everyone

    futures = admin.alter_user_scram_credentials([
        KafkaDeletion("grace", ScramMechanism.SCRAM_SHA_512)])
    assert futures["grace"].result(60) is None
    futures = admin.alter_user_scram_credentials([
        KafkaDeletion("grace", ScramMechanism.SCRAM_SHA_512)])
    with pytest.raises(KafkaException, match="does not exist"):
        futures["grace"].result(60)
    with pytest.raises(KafkaException, match="does not exist"):
        admin.describe_user_scram_credentials(["nobody"])["nobody"].result(60)
    assert _described_by_every_broker(cluster, "grace") == {UserScramCredentialsDescription(
        "grace", (ScramCredentialInfo(SHA256, 8192),))}
