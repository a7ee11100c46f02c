"""Users' SCRAM credentials (KRaft's ScramControlManager). Runs in the driver, inside the
controller.

A credential is kept as Kafka keeps it: per user and mechanism, the salt, the iteration count and
the stored and server keys derived from the salted password the client sent. The password never
reaches a server, so neither the metadata log nor any broker can hold it. Credentials go to the
brokers with the metadata, where the doors' authenticators look them up.

`alter_user_scram_credentials` is a handler: it checks each alteration as Kafka's controller does
and returns the records and one result per user, changing nothing itself. A user's alterations
apply together or not at all: the first one refused is that user's result, and none of that
user's records is written. Unlike KRaft, which refuses a second alteration of the same user (any
mechanism) in one request, a user may alter each mechanism once per request, as Kafka's tools ask
(`--add-config 'SCRAM-SHA-256=[...],SCRAM-SHA-512=[...]'`), and ZooKeeper-era Kafka allowed.

Invariants: every credential in the metadata has a known mechanism, a non-empty user name and
salt, an iteration count within Kafka's limits, and keys of its hash's length.
Not thread-safe: the controller holds its lock around every call.
"""

from __future__ import annotations

from collections.abc import Sequence

from deltabus import errors
from deltabus.cluster.metadata_records import (
    ControllerResult,
    MetadataRecord,
    RemoveUserScramCredentialRecord,
    UserScramCredentialRecord,
)
from deltabus.cluster.metadata_state import MetadataState
from deltabus.metadata import ScramCredentialDeletion, ScramCredentialUpsertion
from deltabus.security import scram

AlterResults = dict[str, errors.DeltaBusError | None]  # user -> None (done) or why not


def alter_user_scram_credentials(state: MetadataState,
                                 deletions: Sequence[ScramCredentialDeletion],
                                 upsertions: Sequence[ScramCredentialUpsertion]
                                 ) -> ControllerResult[AlterResults]:
    """Kafka's AlterUserScramCredentials: the records of every user whose alterations all pass,
    and a result per user (in the order users first appear in the request)."""
    results: AlterResults = {}
    records: dict[str, list[MetadataRecord]] = {}
    seen: set[tuple[str, str]] = set()
    alterations: list[ScramCredentialDeletion | ScramCredentialUpsertion] = [
        *deletions, *upsertions]
    for alteration in alterations:
        user = alteration.name
        if results.setdefault(user, None) is not None:
            continue  # this user is refused already
        try:
            if (user, alteration.mechanism) in seen:
                raise errors.DuplicateResourceError(
                    "A user credential cannot be altered twice in the same request")
            seen.add((user, alteration.mechanism))
            record = (_upsertion_record(alteration)
                      if isinstance(alteration, ScramCredentialUpsertion)
                      else _deletion_record(state, alteration))
            records.setdefault(user, []).append(record)
        except errors.DeltaBusError as e:
            results[user] = e
    return ControllerResult(
        [r for user, rs in records.items() if results[user] is None for r in rs], results)


def _check_name_and_mechanism(name: str, mechanism: str) -> None:
    if not name:
        raise errors.UnacceptableCredentialError("Username must not be empty")
    if mechanism not in scram.MECHANISMS:
        raise errors.UnsupportedSaslMechanismError(
            f"Unknown SCRAM mechanism {mechanism!r}: use one of {', '.join(scram.MECHANISMS)}")


def _deletion_record(state: MetadataState,
                     deletion: ScramCredentialDeletion) -> RemoveUserScramCredentialRecord:
    _check_name_and_mechanism(deletion.name, deletion.mechanism)
    if state.scram_credential(deletion.name, deletion.mechanism) is None:
        raise errors.ResourceNotFoundError(
            "Attempt to delete a user credential that does not exist")
    return RemoveUserScramCredentialRecord(deletion.name, deletion.mechanism)


def _upsertion_record(upsertion: ScramCredentialUpsertion) -> UserScramCredentialRecord:
    """The credential of a salted password, derived here as Kafka's controller does."""
    _check_name_and_mechanism(upsertion.name, upsertion.mechanism)
    if upsertion.iterations < scram.MIN_ITERATIONS:
        raise errors.UnacceptableCredentialError(
            f"Too few iterations: {upsertion.iterations} (at least {scram.MIN_ITERATIONS})")
    if upsertion.iterations > scram.MAX_ITERATIONS:
        raise errors.UnacceptableCredentialError(
            f"Too many iterations: {upsertion.iterations} (at most {scram.MAX_ITERATIONS})")
    if not 0 < len(upsertion.salt) <= scram.SALT_BYTES_MAX:
        raise errors.UnacceptableCredentialError(
            f"The salt must be 1 to {scram.SALT_BYTES_MAX} bytes, not {len(upsertion.salt)}")
    expected = scram.digest_bytes(upsertion.mechanism)
    if len(upsertion.salted_password) != expected:
        raise errors.UnacceptableCredentialError(
            f"A {upsertion.mechanism} salted password is {expected} bytes, not "
            f"{len(upsertion.salted_password)}")
    credential = scram.from_salted_password(upsertion.mechanism, upsertion.salt,
                                            upsertion.salted_password, upsertion.iterations)
    return UserScramCredentialRecord(upsertion.name, upsertion.mechanism, credential.salt,
                                     credential.stored_key, credential.server_key,
                                     credential.iterations)
