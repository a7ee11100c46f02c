"""Users' SCRAM credentials as a Kafka user manages them: `deltabus configs --entity-type users`
(kafka-configs.sh's flags and output lines), against a real controller and its gRPC door (no
Spark: tests/cluster/controller_server.py). The password never appears in any output, also when
the command is refused. Over a whole cluster: tests/cluster/test_scram_credentials.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from deltabus.cli.main import main
from deltabus.security.scram import verify_password
from tests.cluster.controller_server import ControllerServer, serve

SECRET = "pw-secret-never-shown"


@pytest.fixture
def controller_server(tmp_path: Path) -> Iterator[ControllerServer]:
    yield from serve(tmp_path)


@pytest.fixture
def configs(controller_server: ControllerServer, capsys: pytest.CaptureFixture[str]):
    """Runs `deltabus configs ...` in-process; returns (rc, stdout, stderr), which never hold
    the password."""
    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        rc = main(["configs", *argv, "--bootstrap-server", controller_server.address])
        out, err = capsys.readouterr()
        assert SECRET not in out + err
        return rc, out, err
    return run


def test_add_describe_and_delete_credentials(configs, controller_server: ControllerServer
                                             ) -> None:
    rc, out, err = configs(
        "--alter", "--add-config",
        f"SCRAM-SHA-256=[iterations=8192,password={SECRET}],SCRAM-SHA-512=[password=x,y]",
        "--entity-type", "users", "--entity-name", "alice")
    assert (rc, out, err) == (0, "Completed updating config for user alice.\n", "")
    controller = controller_server.controller
    assert verify_password(controller.scram_credential("alice", "SCRAM-SHA-256"), SECRET)
    assert verify_password(controller.scram_credential("alice", "SCRAM-SHA-512"), "x,y")
    assert configs("--alter", "--add-config", "SCRAM-SHA-256=[password=b]", "--entity-type",
                   "users", "--entity-name", "bob")[0] == 0

    rc, out, _ = configs("--describe", "--entity-type", "users", "--entity-name", "alice")
    assert (rc, out) == (0, "SCRAM credential configs for user-principal 'alice' are "
                            "SCRAM-SHA-256=iterations=8192, SCRAM-SHA-512=iterations=4096\n")
    rc, out, _ = configs("--describe", "--entity-type", "users")
    assert (rc, out.splitlines()) == (0, [
        "SCRAM credential configs for user-principal 'alice' are "
        "SCRAM-SHA-256=iterations=8192, SCRAM-SHA-512=iterations=4096",
        "SCRAM credential configs for user-principal 'bob' are SCRAM-SHA-256=iterations=4096"])

    rc, out, _ = configs("--alter", "--delete-config", "SCRAM-SHA-512", "--entity-type",
                         "users", "--entity-name", "alice")
    assert (rc, out) == (0, "Completed updating config for user alice.\n")
    rc, out, _ = configs("--describe", "--entity-type", "users", "--entity-name", "alice")
    assert out == ("SCRAM credential configs for user-principal 'alice' are "
                   "SCRAM-SHA-256=iterations=8192\n")
    # A user without credentials: Kafka's line for the failed user, on stdout.
    rc, out, _ = configs("--describe", "--entity-type", "users", "--entity-name", "carol")
    assert (rc, out) == (0, "Error retrieving SCRAM credential configs for user-principal "
                            "'carol': RESOURCE_NOT_FOUND: Attempt to describe a user credential "
                            "that does not exist: carol\n")


@pytest.mark.parametrize(("argv", "message"), [
    (["--add-config", f"SCRAM-SHA-256=[iterations=100,password={SECRET}]"],
     "Iterations 100 is less than the minimum 4096 required for SCRAM-SHA-256"),
    (["--add-config", f"SCRAM-SHA-256=[iterations=99999,password={SECRET}]"],
     "UNACCEPTABLE_CREDENTIAL: Too many iterations"),
    (["--add-config", f"SCRAM-SHA-256=[pass={SECRET}]"],
     "Invalid credential property for SCRAM-SHA-256"),
    (["--add-config", "SCRAM-SHA-256=[password=]"],
     "password for SCRAM-SHA-256 must not be empty"),
    (["--add-config", f"SCRAM-SHA-1=[password={SECRET}]"],
     "Unexpected config names: SCRAM-SHA-1"),
    (["--add-config", "retention.ms=5"], "Unexpected config names: retention.ms"),
    (["--delete-config", "SCRAM-SHA-512"],
     "RESOURCE_NOT_FOUND: Attempt to delete a user credential that does not exist"),
    (["--add-config", f"SCRAM-SHA-256=[password={SECRET}]", "--delete-config",
      "SCRAM-SHA-256"], "SCRAM-SHA-256 cannot be both added and deleted"),
    ([], "At least one of --add-config or --delete-config must be specified"),
], ids=["few-iterations", "many-iterations", "no-password", "empty-password",
        "unknown-mechanism", "topic-config", "delete-missing", "add-and-delete",
        "nothing"])
def test_bad_credential_changes_are_refused_in_one_line(configs, argv: list[str],
                                                        message: str) -> None:
    rc, out, err = configs("--alter", *argv, "--entity-type", "users", "--entity-name", "dave")
    assert rc == 1 and out == "" and err.startswith("Error: ") and err.count("\n") == 1, err
    assert message in err, err
    rc, out, _ = configs("--describe", "--entity-type", "users")
    assert (rc, out) == (0, "")  # nothing was stored


def test_user_commands_that_make_no_sense(configs) -> None:
    rc, _, err = configs("--alter", "--add-config", f"SCRAM-SHA-256=[password={SECRET}]",
                         "--entity-type", "users")
    assert rc == 1 and "An entity name must be specified with --alter of users" in err
    rc, _, err = configs("--describe", "--all", "--entity-type", "users")
    assert rc == 1 and "--all can only be used with --entity-type topics" in err


def test_a_password_is_everything_after_password_as_kafka_reads_it(
        configs, controller_server: ControllerServer) -> None:
    """kafka-configs takes iterations first; written after the password, they are part of it."""
    assert configs("--alter", "--add-config",
                   f"SCRAM-SHA-256=[password={SECRET},iterations=8192]", "--entity-type",
                   "users", "--entity-name", "erin")[0] == 0
    credential = controller_server.controller.scram_credential("erin", "SCRAM-SHA-256")
    assert credential.iterations == 4096
    assert verify_password(credential, f"{SECRET},iterations=8192")
