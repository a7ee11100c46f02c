"""Who is calling: the listeners' authentication, against users' SCRAM credentials.

Both doors check the same users (`deltabus configs --entity-type users`, kept as SCRAM credentials
in the controller's metadata and handed to brokers): the Kafka door with SASL (PLAIN, and the
SCRAM-SHA-256/512 exchange, one `SaslExchange` per connection), the gRPC door with each call's
`authorization: Basic` user and password (over TLS). A check that passes gives the caller's
principal (`User:alice`); one that fails raises SASL_AUTHENTICATION_FAILED with Kafka's message,
which never says whether the user or the password was wrong.

A password check derives the stored key again (PBKDF2, thousands of rounds), too slow for every
gRPC call, so a user's last good password is remembered (as a SHA-256 digest, in memory only)
until the user's credential changes.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
from collections.abc import Callable

import scramp

from deltabus import errors
from deltabus.security.principal import KafkaPrincipal, user
from deltabus.security.scram import MECHANISMS, ScramCredential, verify_password

# Looks up a user's credential for a mechanism (the broker's or controller's metadata).
CredentialLookup = Callable[[str, str], ScramCredential | None]


def _failed(mechanism: str) -> errors.DeltaBusError:
    return errors.SaslAuthenticationFailedError(
        f"Authentication failed during authentication due to invalid credentials with SASL "
        f"mechanism {mechanism}")


class Authenticator:
    """Checks passwords and SCRAM exchanges against the users' SCRAM credentials."""

    def __init__(self, lookup: CredentialLookup, mechanisms: tuple[str, ...]) -> None:
        self._lookup = lookup
        self.mechanisms = mechanisms
        self._lock = threading.Lock()
        # user -> (credential, digest of the password it last accepted)
        self._accepted: dict[str, tuple[ScramCredential, bytes]] = {}

    def check_password(self, name: str, password: str,
                       mechanism: str = "PLAIN") -> KafkaPrincipal:
        """The principal of `name` if `password` matches one of its SCRAM credentials."""
        digest = hashlib.sha256(password.encode()).digest()
        for scram_mechanism in MECHANISMS:
            credential = self._lookup(name, scram_mechanism)
            if credential is None:
                continue
            with self._lock:
                known = self._accepted.get(name)
            if known is not None and known[0] == credential and hmac.compare_digest(
                    known[1], digest):
                return user(name)
            if verify_password(credential, password):
                with self._lock:
                    self._accepted[name] = (credential, digest)
                return user(name)
        raise _failed(mechanism)

    def exchange(self, mechanism: str) -> SaslExchange:
        """A new SASL exchange of `mechanism` (SaslHandshake has checked it is enabled)."""
        if mechanism == "PLAIN":
            return PlainExchange(self)
        return ScramExchange(self, mechanism, self._lookup)


class SaslExchange:
    """One connection's SASL exchange: tokens in, tokens out, a principal at the end."""

    mechanism = ""
    principal: KafkaPrincipal | None = None  # set once the exchange succeeded

    def step(self, token: bytes) -> bytes:
        """The server's answer to the client's next token; raises SASL_AUTHENTICATION_FAILED
        (or ILLEGAL_SASL_STATE for a token after the end)."""
        raise NotImplementedError


class PlainExchange(SaslExchange):
    """RFC 4616: one token, `authzid NUL authcid NUL password`."""

    mechanism = "PLAIN"

    def __init__(self, authenticator: Authenticator) -> None:
        self._authenticator = authenticator

    def step(self, token: bytes) -> bytes:
        if self.principal is not None:
            raise errors.IllegalSaslStateError("the PLAIN exchange is already complete")
        parts = token.split(b"\x00")
        if len(parts) != 3 or not parts[1]:
            raise errors.SaslAuthenticationFailedError(
                "Authentication failed: invalid SASL/PLAIN response")
        authzid, name, password = (p.decode("utf-8", "replace") for p in parts)
        if authzid and authzid != name:
            raise errors.SaslAuthenticationFailedError(
                "Authentication failed: Client requested an authorization id that is different "
                "from username")
        self.principal = self._authenticator.check_password(name, password, "PLAIN")
        return b""


class ScramExchange(SaslExchange):
    """RFC 5802: client-first, server-first, client-final, server-final."""

    def __init__(self, authenticator: Authenticator, mechanism: str,
                 lookup: CredentialLookup) -> None:
        self.mechanism = mechanism
        self._lookup = lookup
        self._name = ""
        self._server = scramp.ScramMechanism(mechanism).make_server(self._auth_info)
        self._round = 0

    def _auth_info(self, name: str) -> tuple[bytes, bytes, bytes, int]:
        credential = self._lookup(name, self.mechanism)
        if credential is None:
            raise _failed(self.mechanism)
        return credential.salt, credential.stored_key, credential.server_key, credential.iterations

    def step(self, token: bytes) -> bytes:
        self._round += 1
        try:
            text = token.decode("utf-8")
            if self._round == 1:
                self._name = _scram_user(text)
                self._server.set_client_first(text)
                return self._server.get_server_first().encode()
            if self._round == 2:
                self._accept_a_repeated_client_nonce(text)
                self._server.set_client_final(text)
                answer = self._server.get_server_final().encode()
                self.principal = user(self._name)
                return answer
        except (scramp.ScramException, UnicodeDecodeError, ValueError):
            raise _failed(self.mechanism) from None
        raise errors.IllegalSaslStateError(f"the {self.mechanism} exchange is already complete")

    def _accept_a_repeated_client_nonce(self, client_final: str) -> None:
        """librdkafka 2.0 (kcat's, on Debian 12) puts its own nonce again in front of the
        server-first nonce in client-final. Kafka's ScramSaslServer takes any client-final
        nonce that ends with the server-first one, and so does this: the proof is computed over
        the message as sent, so it binds this server nonce all the same. scramp checks for
        equality, so it is given the longer nonce to compare with."""
        sent = next((p[2:] for p in client_final.split(",") if p.startswith("r=")), "")
        nonce = str(self._server.nonce)
        if sent != nonce and sent.endswith(nonce):
            self._server.nonce = scramp.core.Nonce(sent)


def _scram_user(client_first: str) -> str:
    """The user name of a client-first message (`n,,n=alice,r=...`), unescaped (=2C, =3D)."""
    bare = client_first.split(",", 2)[2] if client_first.count(",") >= 2 else ""
    for part in bare.split(","):
        if part.startswith("n="):
            return part[2:].replace("=2C", ",").replace("=3D", "=")
    raise ValueError("no user name in the SCRAM client-first message")
