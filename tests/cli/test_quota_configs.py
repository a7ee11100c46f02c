"""Client quotas as a Kafka user sets them: `deltabus configs --entity-type users|clients`
(kafka-configs.sh), its flags and output lines, against the shared cluster."""

from __future__ import annotations

import pytest

from tests.cli.conftest import Cli


def test_alter_and_describe_quotas_as_kafka_configs(cli: Cli, topic_name: str,
                                                    no_quotas_left: None) -> None:
    user = topic_name
    rc, out, _ = cli("configs", "--alter", "--entity-type", "users", "--entity-name", user,
                     "--add-config",
                     "producer_byte_rate=1024,consumer_byte_rate=2048,request_percentage=200")
    assert (rc, out) == (0, f"Completed updating config for user {user}.\n")
    rc, out, _ = cli("configs", "--alter", "--entity-type", "users", "--entity-name", user,
                     "--entity-type", "clients", "--entity-name", "app",
                     "--add-config", "producer_byte_rate=4096")
    assert (rc, out) == (0, f"Completed updating config for user {user}.\n")
    rc, out, _ = cli("configs", "--alter", "--entity-type", "clients", "--entity-default",
                     "--add-config", "consumer_byte_rate=1000000")
    assert (rc, out) == (0, "Completed updating default config for clients in the cluster.\n")

    rc, out, _ = cli("configs", "--describe", "--entity-type", "users", "--entity-name", user)
    assert rc == 0
    assert out.splitlines()[0] == (
        f"Quota configs for user-principal '{user}' are consumer_byte_rate=2048.0, "
        "producer_byte_rate=1024.0, request_percentage=200.0")
    rc, out, _ = cli("configs", "--describe", "--entity-type", "users", "--entity-name", user,
                     "--entity-type", "clients")
    assert (rc, out) == (0, f"Quota configs for user-principal '{user}', client-id 'app' are "
                            "producer_byte_rate=4096.0\n")
    rc, out, _ = cli("configs", "--describe", "--entity-type", "clients", "--entity-default")
    assert (rc, out) == (0, "Quota configs for the default client-id are "
                            "consumer_byte_rate=1000000.0\n")

    rc, out, _ = cli("configs", "--alter", "--entity-type", "users", "--entity-name", user,
                     "--delete-config", "consumer_byte_rate,request_percentage")
    assert rc == 0
    rc, out, _ = cli("configs", "--describe", "--entity-type", "users", "--entity-name", user)
    assert out.splitlines()[0] == (
        f"Quota configs for user-principal '{user}' are producer_byte_rate=1024.0")


@pytest.mark.parametrize(("argv", "message"), [
    (["--alter", "--entity-type", "clients", "--entity-name", "c", "--add-config",
      "producer_byte_rate=fast"], "Invalid value fast for quota producer_byte_rate"),
    (["--alter", "--entity-type", "clients", "--entity-name", "c", "--add-config",
      "producer_byte_rate=10.5"], "must be an integer"),
    (["--alter", "--entity-type", "clients", "--entity-name", "c", "--add-config",
      "bytes_rate=10"], "Invalid configuration key bytes_rate"),
    (["--alter", "--entity-type", "clients", "--add-config", "producer_byte_rate=10"],
     "An entity name or --entity-default must be given"),
    (["--describe", "--entity-type", "topics", "--entity-type", "clients"],
     "Only users and clients can be combined for quotas"),
])
def test_bad_quota_commands_say_why(cli: Cli, argv: list[str], message: str) -> None:
    rc, _, err = cli("configs", *argv)
    assert rc == 1 and message in err
