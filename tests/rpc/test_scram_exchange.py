"""The SCRAM exchange as Kafka's broker runs it, message by message (no sockets): an RFC 5802
client gets in; librdkafka 2.0's client-final, which repeats the client nonce in front of the
server's, gets in as on Kafka's broker (the proof covers the message as sent); a client-final
whose nonce does not end with the server's, or a wrong proof, is refused."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
import scramp

from deltabus import errors
from deltabus.rpc.authentication import Authenticator
from deltabus.security.scram import make_credential, salted_password

MECHANISM, USER, PASSWORD = "SCRAM-SHA-256", "alice", "alice-secret"
CREDENTIAL = make_credential(MECHANISM, PASSWORD)
CLIENT_NONCE = "fyko+d2lbbFgONRv9qkxdawL"


def exchange():
    authenticator = Authenticator(lambda name, m: CREDENTIAL if name == USER else None,
                                  (MECHANISM,))
    return authenticator.exchange(MECHANISM)


def final_message(server_first: str, nonce: str, password: str = PASSWORD) -> str:
    """A client-final message for `nonce` with the proof RFC 5802 computes over it."""
    fields = dict(part.split("=", 1) for part in server_first.split(","))
    salted = salted_password(MECHANISM, password, base64.b64decode(fields["s"]),
                             int(fields["i"]))
    without_proof = f"c=biws,r={nonce}"
    auth_message = f"n={USER},r={CLIENT_NONCE},{server_first},{without_proof}".encode()
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    signature = hmac.new(hashlib.sha256(client_key).digest(), auth_message, "sha256").digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    return f"{without_proof},p={base64.b64encode(proof).decode()}"


def server_nonce(server_first: str) -> str:
    return dict(part.split("=", 1) for part in server_first.split(","))["r"]


def test_an_rfc_5802_client_gets_in() -> None:
    client = scramp.ScramClient([MECHANISM], USER, PASSWORD)
    server = exchange()
    client.set_server_first(server.step(client.get_client_first().encode()).decode())
    client.set_server_final(server.step(client.get_client_final().encode()).decode())
    assert str(server.principal) == f"User:{USER}"


def test_librdkafka_2_0s_repeated_client_nonce_gets_in() -> None:
    server = exchange()
    first = server.step(f"n,,n={USER},r={CLIENT_NONCE}".encode()).decode()
    nonce = server_nonce(first)
    assert nonce.startswith(CLIENT_NONCE)
    answer = server.step(final_message(first, CLIENT_NONCE + nonce).encode())
    assert answer.startswith(b"v=")
    assert str(server.principal) == f"User:{USER}"


@pytest.mark.parametrize("wrong", ["nonce", "proof"])
def test_a_foreign_nonce_or_a_wrong_proof_is_refused(wrong: str) -> None:
    server = exchange()
    first = server.step(f"n,,n={USER},r={CLIENT_NONCE}".encode()).decode()
    nonce = server_nonce(first)
    final = (final_message(first, nonce + "x") if wrong == "nonce"
             else final_message(first, CLIENT_NONCE + nonce, password="guess"))
    with pytest.raises(errors.SaslAuthenticationFailedError, match="invalid credentials"):
        server.step(final.encode())
    assert server.principal is None
