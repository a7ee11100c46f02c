"""Who makes a request: Kafka's principals (`User:alice`).

A listener authenticates a connection or call (SASL, a TLS client certificate, a gRPC call's
user and password) and every request it carries then acts as that principal; ACLs name
principals. A PLAINTEXT or SSL listener without client certificates gives `User:ANONYMOUS`, as
Kafka's does. Pure: the standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from deltabus import errors


@dataclass(frozen=True, order=True)
class KafkaPrincipal:
    principal_type: str
    name: str

    def __str__(self) -> str:
        return f"{self.principal_type}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> KafkaPrincipal:
        """`User:alice` (a principal's string form, as kafka-acls and super.users write it)."""
        kind, sep, name = text.partition(":")
        if not sep or not kind or not name:
            raise errors.InvalidRequestError(
                f"a principal is written TYPE:NAME (User:alice), not {text!r}")
        return cls(kind, name)


ANONYMOUS = KafkaPrincipal("User", "ANONYMOUS")


def user(name: str) -> KafkaPrincipal:
    return KafkaPrincipal("User", name)
