"""Users' SCRAM credentials in the controller: AlterUserScramCredentials checked as Kafka's
controller checks it, one result per user, and DescribeUserScramCredentials showing mechanisms
and iteration counts only. Handlers change nothing; replaying their records does. No Spark."""

from __future__ import annotations

import copy

import pytest

from deltabus import errors
from deltabus.cluster import credential_control
from deltabus.cluster.metadata_records import (
    RemoveUserScramCredentialRecord,
    UserScramCredentialRecord,
)
from deltabus.cluster.metadata_state import MetadataState
from deltabus.metadata import (
    ScramCredentialDeletion,
    ScramCredentialInfo,
    ScramCredentialUpsertion,
    UserScramCredentialsDescription,
    describe_scram_credentials,
)
from deltabus.security.scram import salted_password, verify_password

SHA256, SHA512 = "SCRAM-SHA-256", "SCRAM-SHA-512"
SALT = b"0123456789abcdef"


def _upsert(user: str, password: str, mechanism: str = SHA256, iterations: int = 4096,
            salt: bytes = SALT) -> ScramCredentialUpsertion:
    """What a client sends: the salted password, never the password."""
    return ScramCredentialUpsertion(user, mechanism, iterations, salt,
                                    salted_password(mechanism, password, salt, iterations))


def _alter(state: MetadataState, deletions: list[ScramCredentialDeletion] = (),
           upsertions: list[ScramCredentialUpsertion] = ()) -> dict:
    """Run the handler, check it changed nothing, then replay its records; the results."""
    before = copy.deepcopy(state)
    result = credential_control.alter_user_scram_credentials(state, deletions, upsertions)
    assert state == before
    for record in result.records:
        state.replay(record)
    return result.response


def _codes(results: dict) -> dict[str, int]:
    return {user: error.code if error else 0 for user, error in results.items()}


def test_upserted_credentials_check_their_password_only() -> None:
    state = MetadataState()
    results = _alter(state, upsertions=[_upsert("alice", "alice-secret", SHA256, 8192),
                                        _upsert("alice", "other", SHA512),
                                        _upsert("bob", "bob-secret")])
    assert results == {"alice": None, "bob": None}
    credential = state.scram_credential("alice", SHA256)
    assert credential is not None and credential.iterations == 8192
    assert verify_password(credential, "alice-secret")
    assert not verify_password(credential, "alice-secreT")
    assert verify_password(state.scram_credential("alice", SHA512), "other")
    # A new password replaces the old one.
    assert _alter(state, upsertions=[_upsert("alice", "new", SHA256)]) == {"alice": None}
    assert verify_password(state.scram_credential("alice", SHA256), "new")
    assert not verify_password(state.scram_credential("alice", SHA256), "alice-secret")


def test_records_hold_the_keys_and_never_the_password() -> None:
    result = credential_control.alter_user_scram_credentials(
        MetadataState(), [], [_upsert("alice", "alice-secret")])
    (record,) = result.records
    assert isinstance(record, UserScramCredentialRecord)
    assert (record.name, record.mechanism, record.salt, record.iterations) == (
        "alice", SHA256, SALT, 4096)
    assert len(record.stored_key) == len(record.server_key) == 32
    assert b"alice-secret" not in b"".join((record.salt, record.stored_key, record.server_key))


def test_delete_one_mechanism_then_the_last() -> None:
    state = MetadataState()
    _alter(state, upsertions=[_upsert("alice", "a"), _upsert("alice", "a", SHA512)])
    result = credential_control.alter_user_scram_credentials(
        state, [ScramCredentialDeletion("alice", SHA512)], [])
    assert result.records == [RemoveUserScramCredentialRecord("alice", SHA512)]
    assert _alter(state, [ScramCredentialDeletion("alice", SHA512)]) == {"alice": None}
    assert state.scram_credential("alice", SHA512) is None
    assert state.scram_credential("alice", SHA256) is not None
    assert _alter(state, [ScramCredentialDeletion("alice", SHA256)]) == {"alice": None}
    assert state.scram_credentials == {}


@pytest.mark.parametrize(("alteration", "error", "message"), [
    (_upsert("alice", "p", iterations=4095), errors.UnacceptableCredentialError,
     "Too few iterations"),
    (_upsert("alice", "p", iterations=16385), errors.UnacceptableCredentialError,
     "Too many iterations"),
    (_upsert("alice", "p", salt=b""), errors.UnacceptableCredentialError, "salt must be"),
    (_upsert("alice", "p", salt=b"s" * 1025), errors.UnacceptableCredentialError,
     "salt must be"),
    (ScramCredentialUpsertion("alice", SHA256, 4096, SALT, b""),
     errors.UnacceptableCredentialError, "salted password is 32 bytes, not 0"),
    (ScramCredentialUpsertion("alice", SHA512, 4096, SALT, b"x" * 32),
     errors.UnacceptableCredentialError, "salted password is 64 bytes, not 32"),
    (_upsert("", "p"), errors.UnacceptableCredentialError, "Username must not be empty"),
    (ScramCredentialUpsertion("alice", "SCRAM-MD5", 4096, SALT, b"x" * 32),
     errors.UnsupportedSaslMechanismError, "Unknown SCRAM mechanism"),
    (ScramCredentialDeletion("alice", "UNKNOWN"), errors.UnsupportedSaslMechanismError,
     "Unknown SCRAM mechanism"),
    (ScramCredentialDeletion("alice", SHA256), errors.ResourceNotFoundError,
     "Attempt to delete a user credential that does not exist"),
    (ScramCredentialDeletion("", SHA256), errors.UnacceptableCredentialError,
     "Username must not be empty"),
], ids=["few-iterations", "many-iterations", "empty-salt", "huge-salt", "empty-salted-password",
        "short-salted-password", "empty-user", "unknown-mechanism", "delete-unknown-mechanism",
        "delete-missing", "delete-empty-user"])
def test_refused_alterations_write_nothing(alteration: object, error: type[Exception],
                                           message: str) -> None:
    state = MetadataState()
    deletions = [alteration] if isinstance(alteration, ScramCredentialDeletion) else []
    upsertions = [alteration] if isinstance(alteration, ScramCredentialUpsertion) else []
    result = credential_control.alter_user_scram_credentials(state, deletions, upsertions)
    assert result.records == []
    (refused,) = result.response.values()
    assert isinstance(refused, error) and message in refused.message


def test_a_users_alterations_apply_together_or_not_at_all() -> None:
    state = MetadataState()
    _alter(state, upsertions=[_upsert("carol", "c")])
    results = _alter(
        state, [ScramCredentialDeletion("carol", SHA256)],
        [_upsert("alice", "a"), _upsert("alice", "a", SHA512, iterations=100),
         _upsert("bob", "b")])
    assert _codes(results) == {"carol": 0, "alice": 93, "bob": 0}
    assert list(results) == ["carol", "alice", "bob"]  # in the order users first appear
    assert sorted(state.scram_credentials) == ["bob"]  # alice's good SHA-256 was not written


def test_one_credential_twice_in_a_request_is_a_duplicate() -> None:
    state = MetadataState()
    _alter(state, upsertions=[_upsert("alice", "a")])
    results = _alter(state, [ScramCredentialDeletion("alice", SHA256)],
                     [_upsert("alice", "b"), _upsert("bob", "b"), _upsert("bob", "c")])
    assert _codes(results) == {"alice": 92, "bob": 92}
    assert "cannot be altered twice" in results["bob"].message
    assert verify_password(state.scram_credential("alice", SHA256), "a")  # unchanged
    assert state.scram_credential("bob", SHA256) is None


def test_describe_shows_mechanisms_and_iterations_only() -> None:
    state = MetadataState()
    _alter(state, upsertions=[_upsert("bob", "b", SHA512, 8192), _upsert("bob", "b"),
                              _upsert("alice", "a")])
    alice = UserScramCredentialsDescription("alice", (ScramCredentialInfo(SHA256, 4096),))
    bob = UserScramCredentialsDescription("bob", (ScramCredentialInfo(SHA256, 4096),
                                                  ScramCredentialInfo(SHA512, 8192)))
    assert describe_scram_credentials(state.scram_credentials, None) == {
        "alice": alice, "bob": bob}
    assert describe_scram_credentials(state.scram_credentials, []) == {
        "alice": alice, "bob": bob}
    assert describe_scram_credentials(state.scram_credentials, ["bob"]) == {"bob": bob}
    results = describe_scram_credentials(state.scram_credentials, ["nobody", "alice", "alice"])
    assert list(results) == ["nobody", "alice"]
    assert isinstance(results["nobody"], errors.ResourceNotFoundError)
    assert "does not exist: nobody" in results["nobody"].message
    assert isinstance(results["alice"], errors.DuplicateResourceError)
    assert describe_scram_credentials({}, None) == {}
