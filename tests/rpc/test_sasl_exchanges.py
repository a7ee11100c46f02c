"""SASL exchanges on their own (no server): the right tokens authenticate, and any bytes a client
can send (fuzzed) end in a refusal naming SASL, never another exception that would take down the
connection's thread in a way the listener does not expect."""

from __future__ import annotations

import pytest
import scramp
from hypothesis import given, settings
from hypothesis import strategies as st

from deltabus import errors
from deltabus.rpc.authentication import Authenticator
from deltabus.security.principal import user
from deltabus.security.scram import make_credential

CREDENTIALS = {("alice", m): make_credential(m, "alice-secret", iterations=4096)
               for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")}
AUTHENTICATOR = Authenticator(lambda u, m: CREDENTIALS.get((u, m)),
                              ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"))


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_scram_exchange_with_the_right_password_names_the_user(mechanism: str) -> None:
    exchange = AUTHENTICATOR.exchange(mechanism)
    client = scramp.ScramClient([mechanism], "alice", "alice-secret")
    client.set_server_first(exchange.step(client.get_client_first().encode()).decode())
    client.set_server_final(exchange.step(client.get_client_final().encode()).decode())
    assert exchange.principal == user("alice")
    with pytest.raises(errors.IllegalSaslStateError):
        exchange.step(b"again")


def test_plain_checks_the_scram_credential_and_refuses_a_foreign_authzid() -> None:
    exchange = AUTHENTICATOR.exchange("PLAIN")
    exchange.step(b"\x00alice\x00alice-secret")
    assert exchange.principal == user("alice")
    for token in (b"\x00alice\x00wrong", b"bob\x00alice\x00alice-secret", b"alice-secret",
                  b"\x00\x00alice-secret"):
        with pytest.raises(errors.SaslAuthenticationFailedError):
            AUTHENTICATOR.exchange("PLAIN").step(token)


@settings(max_examples=200, deadline=None)
@given(mechanism=st.sampled_from(["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]),
       tokens=st.lists(st.binary(max_size=300), min_size=1, max_size=3))
def test_any_tokens_end_in_a_sasl_refusal_or_nothing(mechanism: str, tokens: list[bytes]) -> None:
    exchange = AUTHENTICATOR.exchange(mechanism)
    for token in tokens:
        try:
            exchange.step(token)
        except (errors.SaslAuthenticationFailedError, errors.IllegalSaslStateError):
            return
    assert exchange.principal is None  # random bytes never authenticate
