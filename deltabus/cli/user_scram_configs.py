"""`deltabus configs --entity-type users`: users' SCRAM credentials as kafka-configs.sh manages
them, with its flags and output lines:

    --alter --add-config 'SCRAM-SHA-256=[iterations=8192,password=alice-secret]' --entity-name alice
    --alter --delete-config 'SCRAM-SHA-512' --entity-name alice
    --describe [--entity-name alice]

The password is salted and hashed in this process (AdminClient) and is never printed: an error
about a credential names its mechanism, never its value. Quotas, kafka-configs' other user
configs, are `cli.client_quota_configs`'.
"""

from __future__ import annotations

import argparse
import re

from deltabus import errors
from deltabus.cli.options import CliError, admin_settings
from deltabus.client.admin import (
    AdminClient,
    ScramCredentialInfo,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from deltabus.security import scram

# kafka-configs' reading of a credential: iterations first (optional, -1 or empty: the
# default), then the password, which may hold anything, commas included.
_CREDENTIAL = re.compile(r"(?:iterations=(-?[0-9]*),)?password=(.*)", re.DOTALL)


def describe(args: argparse.Namespace) -> int:
    """One line per user, on stdout as kafka-configs prints them (a user without credentials
    too, with its error): mechanisms and iteration counts, never salts or keys."""
    users = [args.entity_name] if args.entity_name else None
    with AdminClient(args.bootstrap_server, **admin_settings(args)) as admin:
        results = admin.describe_user_scram_credentials(users)
    for user, result in results.items():
        if isinstance(result, errors.DeltaBusError):
            print(f"Error retrieving SCRAM credential configs for user-principal '{user}': "
                  f"{result}")
            continue
        described = ", ".join(f"{info.mechanism}=iterations={info.iterations}"
                              for info in result.scram_credential_infos)
        print(f"SCRAM credential configs for user-principal '{user}' are {described}")
    return 0


def alter(args: argparse.Namespace, added: list[tuple[str, str]], deleted: list[str]) -> int:
    """Set and remove one user's credentials in one request: all of them, or none."""
    if not args.entity_name:
        raise CliError("An entity name must be specified with --alter of users")
    unknown = [k for k, _ in added if k not in scram.MECHANISMS]
    if unknown:
        raise CliError(f"Only SCRAM credential configs ({', '.join(scram.MECHANISMS)}) can be "
                       f"added for 'users'. Unexpected config names: {', '.join(unknown)}")
    unknown = [k for k in deleted if k not in scram.MECHANISMS]
    if unknown:
        raise CliError(f"Only SCRAM credential configs ({', '.join(scram.MECHANISMS)}) can be "
                       f"deleted for 'users'. Unexpected config names: {', '.join(unknown)}")
    user = args.entity_name
    alterations: list[UserScramCredentialUpsertion | UserScramCredentialDeletion] = [
        UserScramCredentialDeletion(user, mechanism) for mechanism in deleted]
    for mechanism, value in added:
        iterations, password = _credential(mechanism, value)
        alterations.append(UserScramCredentialUpsertion(
            user, ScramCredentialInfo(mechanism, iterations), password))
    with AdminClient(args.bootstrap_server, **admin_settings(args)) as admin:
        error = admin.alter_user_scram_credentials(alterations).get(user)
    if error is not None:
        raise error
    print(f"Completed updating config for user {user}.")
    return 0


def _credential(mechanism: str, value: str) -> tuple[int, str]:
    """(iterations, password) of `iterations=N,password=P` or `password=P`; an error names the
    mechanism only, so a mistyped password is never echoed."""
    match = _CREDENTIAL.fullmatch(value)
    if match is None:
        raise CliError(f"Invalid credential property for {mechanism}: write "
                       f"{mechanism}=[iterations=N,password=P] or {mechanism}=[password=P]")
    text, password = match.groups()
    iterations = (scram.DEFAULT_ITERATIONS if text in (None, "", "-1") else int(text))
    if iterations < scram.MIN_ITERATIONS:
        raise CliError(f"Iterations {iterations} is less than the minimum "
                       f"{scram.MIN_ITERATIONS} required for {mechanism}")
    if not password:  # Kafka takes an empty password; nobody should log in with one
        raise CliError(f"The password for {mechanism} must not be empty")
    return iterations, password
