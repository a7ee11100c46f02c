"""SCRAM credentials: what deltabus stores lets a standard SCRAM exchange (scramp's client and
server) succeed for the right password only, and checks plain passwords the same way."""

from __future__ import annotations

import pytest
import scramp

from deltabus import errors
from deltabus.security.principal import ANONYMOUS, KafkaPrincipal
from deltabus.security.scram import (
    from_salted_password,
    make_credential,
    salted_password,
    verify_password,
)


def _exchange(credential, user: str, password: str) -> None:
    """A whole SCRAM exchange: scramp's server over our stored credential, scramp's client."""
    server = scramp.ScramMechanism(credential.mechanism).make_server(
        lambda name: (credential.salt, credential.stored_key, credential.server_key,
                      credential.iterations))
    client = scramp.ScramClient([credential.mechanism], user, password)
    server.set_client_first(client.get_client_first())
    client.set_server_first(server.get_server_first())
    server.set_client_final(client.get_client_final())
    client.set_server_final(server.get_server_final())


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_stored_credential_authenticates_the_right_password_only(mechanism: str) -> None:
    credential = make_credential(mechanism, "alice-secret")
    assert b"alice-secret" not in repr(credential).encode()
    _exchange(credential, "alice", "alice-secret")
    with pytest.raises(scramp.ScramException):
        _exchange(credential, "alice", "wrong")
    assert verify_password(credential, "alice-secret")
    assert not verify_password(credential, "alice-secreT")


def test_the_salted_password_a_kafka_admin_client_sends_gives_the_same_credential() -> None:
    made = make_credential("SCRAM-SHA-256", "pw", iterations=8192, salt=b"0123456789abcdef")
    sent = salted_password("SCRAM-SHA-256", "pw", b"0123456789abcdef", 8192)
    assert from_salted_password("SCRAM-SHA-256", b"0123456789abcdef", sent, 8192) == made


def test_bad_mechanisms_and_iteration_counts_are_refused() -> None:
    with pytest.raises(errors.UnsupportedSaslMechanismError):
        make_credential("SCRAM-MD5", "pw")
    with pytest.raises(errors.InvalidRequestError):
        make_credential("SCRAM-SHA-256", "pw", iterations=100)


def test_principals_print_and_parse_as_kafka_writes_them() -> None:
    assert str(ANONYMOUS) == "User:ANONYMOUS"
    assert KafkaPrincipal.parse("User:alice") == KafkaPrincipal("User", "alice")
    assert KafkaPrincipal.parse("User:CN=broker,O=x") == KafkaPrincipal("User", "CN=broker,O=x")
    with pytest.raises(errors.InvalidRequestError):
        KafkaPrincipal.parse("alice")
