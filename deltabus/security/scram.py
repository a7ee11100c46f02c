"""SCRAM credentials (RFC 5802, 7677) as Kafka keeps them: salted and hashed, never the password.

A user's credential for one mechanism (SCRAM-SHA-256 or SCRAM-SHA-512) is the salt, the iteration
count, and two keys derived from the salted password: the stored key lets a server check a
client's proof, the server key lets it prove itself. Neither gives back the password, so the
controller's metadata log and the brokers' metadata hold only these. The same credential checks a
plain password (SASL PLAIN, or a gRPC call's user and password) by deriving the stored key again.

Pure: the standard library only. The SCRAM exchange itself (client-first, server-first, ...) is
`scramp`'s, in the doors.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

from deltabus import errors

# Kafka's mechanisms, with the hash each uses.
MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
# Kafka's limits on the iteration count (ScramMechanism.minIterations / maxIterations).
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
DEFAULT_ITERATIONS = 4096
# What a controller stores of a salt (Kafka sets no limit; clients send 16 to 64 bytes).
SALT_BYTES_MAX = 1024


@dataclass(frozen=True)
class ScramCredential:
    """One user's credential for one mechanism: what the controller stores and brokers hold.
    The salt and keys stay out of its repr (as Kafka's ScramCredentialValue hides them), so
    logging a credential, or anything holding one, shows none of them."""

    mechanism: str
    salt: bytes = field(repr=False)
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)
    iterations: int


def _hash_name(mechanism: str) -> str:
    try:
        return MECHANISMS[mechanism]
    except KeyError:
        raise errors.UnsupportedSaslMechanismError(
            f"unsupported SCRAM mechanism {mechanism!r}: use one of "
            f"{', '.join(MECHANISMS)}") from None


def digest_bytes(mechanism: str) -> int:
    """The length of a salted password (and of the keys) for `mechanism`: its hash's size."""
    return hashlib.new(_hash_name(mechanism)).digest_size


def check_iterations(iterations: int) -> None:
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise errors.InvalidRequestError(
            f"iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}, not {iterations}")


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """Hi(password, salt, i) of RFC 5802: what Kafka's AdminClient sends, never the password."""
    return hashlib.pbkdf2_hmac(_hash_name(mechanism), password.encode(), salt, iterations)


def from_salted_password(mechanism: str, salt: bytes, salted: bytes,
                         iterations: int) -> ScramCredential:
    """The credential of a salted password (AlterUserScramCredentials' upsertion)."""
    name = _hash_name(mechanism)
    check_iterations(iterations)
    client_key = hmac.new(salted, b"Client Key", name).digest()
    stored_key = hashlib.new(name, client_key).digest()
    server_key = hmac.new(salted, b"Server Key", name).digest()
    return ScramCredential(mechanism, salt, stored_key, server_key, iterations)


def make_credential(mechanism: str, password: str, *, iterations: int = DEFAULT_ITERATIONS,
                    salt: bytes | None = None) -> ScramCredential:
    """A new credential for `password` with a random salt (the CLI's --add-config)."""
    salt = secrets.token_bytes(32) if salt is None else salt
    return from_salted_password(mechanism, salt,
                                salted_password(mechanism, password, salt, iterations),
                                iterations)


def verify_password(credential: ScramCredential, password: str) -> bool:
    """Whether `password` is the one `credential` was made from (constant-time compare)."""
    derived = make_credential(credential.mechanism, password, iterations=credential.iterations,
                              salt=credential.salt)
    return hmac.compare_digest(derived.stored_key, credential.stored_key)
