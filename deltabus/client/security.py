"""How a client proves who it is and protects its calls: Kafka's client security configs.

Settings are Kafka's (librdkafka's names, as keyword arguments with underscores):
`security_protocol` PLAINTEXT (the default), SSL, SASL_PLAINTEXT or SASL_SSL; for SASL_*,
`sasl_mechanism` PLAIN (the default), SCRAM-SHA-256 or SCRAM-SHA-512 and the user's
`sasl_username` / `sasl_password`, or a `sasl_jaas_config` in Kafka's form
(`...ScramLoginModule required username="alice" password="...";`); for SSL and SASL_SSL,
`ssl_ca_location` (a PEM file; without it the system's roots), and for mTLS
`ssl_certificate_location` and `ssl_key_location` (PEM; an unencrypted key). kafka-python's
`sasl_plain_username` / `sasl_plain_password` are taken as the same settings.

On the gRPC door, TLS is the channel's (`grpc.ssl_channel_credentials`) and SASL is one header on
every call, `authorization: Basic base64(username:password)` (RFC 7617): the broker checks the
password against the user's SCRAM credentials whatever the mechanism, so there is no handshake
and no extra round trip. Over SASL_PLAINTEXT that password crosses the network in clear, as
Kafka's SASL PLAIN over PLAINTEXT does: use SASL_SSL beyond loopback.

What must stay true: a `ClientSecurity` is checked when it is made (a bad combination is one
InvalidConfigError naming the Kafka setting), its PEM files are read then (so a Spark executor
needs none of them: it gets the bytes with the options), and the password and the private key
appear in no repr, log line or error message. Pure data: immutable, thread-safe, picklable.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

import grpc

from deltabus import errors

__all__ = [
    "AUTHORIZATION_KEY",
    "ClientSecurity",
    "SASL_MECHANISMS",
    "SECURITY_PROPERTIES",
    "SECURITY_PROTOCOLS",
    "SecuritySettings",
    "parse_jaas_config",
    "refuse_java_stores",
    "security_from_properties",
]

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
AUTHORIZATION_KEY = "authorization"  # gRPC metadata keys are lower case
PEM_BYTES_MAX = 1024 * 1024  # a CA bundle is tens of kB; anything bigger is the wrong file

# Kafka's property name -> the keyword argument (CLI --command-config, Spark `kafka.` options).
SECURITY_PROPERTIES = {
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",  # librdkafka's spelling
    "sasl.username": "sasl_username",
    "sasl.password": "sasl_password",
    "sasl.jaas.config": "sasl_jaas_config",
    "ssl.ca.location": "ssl_ca_location",
    "ssl.certificate.location": "ssl_certificate_location",
    "ssl.key.location": "ssl_key_location",
}
# Java's key and trust stores (JKS, PKCS#12): named so the error can say what to give instead.
JAVA_STORE_PROPERTIES = {
    "ssl.truststore.location": "ssl.ca.location",
    "ssl.truststore.certificates": "ssl.ca.location",
    "ssl.keystore.location": "ssl.certificate.location and ssl.key.location",
    "ssl.keystore.certificate.chain": "ssl.certificate.location",
    "ssl.keystore.key": "ssl.key.location",
    "ssl.key.password": "ssl.key.location (an unencrypted key)",
}

# The JAAS login modules that carry a username and a password.
LOGIN_MODULES = ("org.apache.kafka.common.security.plain.PlainLoginModule",
                 "org.apache.kafka.common.security.scram.ScramLoginModule")
JAAS_FLAGS = ("required", "requisite", "sufficient", "optional")
_JAAS_TOKEN = re.compile(r'\s*(?:(?P<quoted>"(?:[^"\\]|\\.)*")|(?P<word>[^\s=;"]+)|(?P<op>[=;]))',
                         re.DOTALL)
_JAAS_ESCAPES = {"n": "\n", "t": "\t", "r": "\r"}
_SETTING_NAME = re.compile(r"(?<![\w/.-])((?:security|sasl|ssl)\.[a-z.]*[a-z])")


class SecuritySettings(TypedDict, total=False):
    """The keyword arguments `Producer`, `Consumer`, `AdminClient` and `ExactlyOncePipeline`
    take for security; `security` hands over a `ClientSecurity` made beforehand instead."""

    security_protocol: str
    sasl_mechanism: str
    sasl_username: str
    sasl_password: str
    sasl_jaas_config: str
    sasl_plain_username: str
    sasl_plain_password: str
    ssl_ca_location: str
    ssl_certificate_location: str
    ssl_key_location: str
    security: ClientSecurity


@dataclass(frozen=True)
class ClientSecurity:
    """A client's checked security settings, and the PEM files they name, read once."""

    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = "PLAIN"
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_ca_pem: bytes | None = field(default=None, init=False, repr=False, compare=False)
    ssl_certificate_pem: bytes | None = field(default=None, init=False, repr=False,
                                              compare=False)
    ssl_key_pem: bytes | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        protocol = str(self.security_protocol).strip().upper()
        if protocol not in SECURITY_PROTOCOLS:
            raise errors.InvalidConfigError(
                f"security.protocol must be one of {', '.join(SECURITY_PROTOCOLS)}, "
                f"not {self.security_protocol!r}")
        mechanism = str(self.sasl_mechanism).strip().upper()
        if mechanism not in SASL_MECHANISMS:
            raise errors.InvalidConfigError(
                f"sasl.mechanism must be one of {', '.join(SASL_MECHANISMS)}, not "
                f"{self.sasl_mechanism!r} (deltabus has no GSSAPI or OAUTHBEARER)")
        object.__setattr__(self, "security_protocol", protocol)
        object.__setattr__(self, "sasl_mechanism", mechanism)
        self._check_sasl()
        self._check_ssl()

    def _check_sasl(self) -> None:
        given = [name for name, value in (("sasl.username", self.sasl_username),
                                          ("sasl.password", self.sasl_password)) if value]
        if not self.uses_sasl:
            if given:
                raise errors.InvalidConfigError(
                    f"{given[0]} is set but security.protocol is {self.security_protocol}: "
                    "set security.protocol to SASL_SSL (or SASL_PLAINTEXT)")
            return
        for name, value in (("sasl.username", self.sasl_username),
                            ("sasl.password", self.sasl_password)):
            if not value:
                raise errors.InvalidConfigError(
                    f"security.protocol {self.security_protocol} needs {name} (or "
                    "sasl.jaas.config with username and password)")
        if ":" in (self.sasl_username or ""):
            raise errors.InvalidConfigError(
                "sasl.username must not contain ':' (it separates user and password, RFC 7617)")

    def _check_ssl(self) -> None:
        locations = (("ssl.ca.location", "ssl_ca", self.ssl_ca_location, "CERTIFICATE"),
                     ("ssl.certificate.location", "ssl_certificate",
                      self.ssl_certificate_location, "CERTIFICATE"),
                     ("ssl.key.location", "ssl_key", self.ssl_key_location, "PRIVATE KEY"))
        if not self.uses_tls:
            given = [name for name, _, path, _ in locations if path]
            if given:
                raise errors.InvalidConfigError(
                    f"{given[0]} is set but security.protocol is {self.security_protocol}: "
                    "set security.protocol to SSL or SASL_SSL")
            return
        if bool(self.ssl_certificate_location) != bool(self.ssl_key_location):
            raise errors.InvalidConfigError(
                "ssl.certificate.location and ssl.key.location go together (mTLS: the client's "
                "certificate and its private key)")
        for name, attribute, path, kind in locations:
            if path:
                object.__setattr__(self, f"{attribute}_pem", _read_pem(name, path, kind))

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @classmethod
    def from_settings(cls, security: ClientSecurity | None = None, *,
                      security_protocol: str = "PLAINTEXT", sasl_mechanism: str = "PLAIN",
                      sasl_username: str | None = None, sasl_password: str | None = None,
                      sasl_jaas_config: str | None = None,
                      sasl_plain_username: str | None = None,
                      sasl_plain_password: str | None = None,
                      ssl_ca_location: str | None = None,
                      ssl_certificate_location: str | None = None,
                      ssl_key_location: str | None = None) -> ClientSecurity:
        """Checked settings from a client's keyword arguments (see `SecuritySettings`)."""
        if security is not None:
            given = (security_protocol != "PLAINTEXT" or sasl_mechanism != "PLAIN" or any(
                v is not None for v in (sasl_username, sasl_password, sasl_jaas_config,
                                        sasl_plain_username, sasl_plain_password,
                                        ssl_ca_location, ssl_certificate_location,
                                        ssl_key_location)))
            if given:
                raise errors.InvalidConfigError(
                    "give security=ClientSecurity(...) or the security settings, not both")
            return security
        username = _one_of("sasl.username", sasl_username, sasl_plain_username)
        password = _one_of("sasl.password", sasl_password, sasl_plain_password)
        if sasl_jaas_config is not None:
            if username is not None or password is not None:
                raise errors.InvalidConfigError(
                    "give sasl.jaas.config or sasl.username and sasl.password, not both")
            username, password = parse_jaas_config(sasl_jaas_config)
        return cls(security_protocol, sasl_mechanism, username, password, ssl_ca_location,
                   ssl_certificate_location, ssl_key_location)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """TLS for a channel: the CA (or the system's roots), and the client's certificate
        and key when it has them (mTLS)."""
        if not self.uses_tls:
            raise errors.InvalidConfigError(
                f"security.protocol {self.security_protocol} has no TLS credentials")
        return grpc.ssl_channel_credentials(root_certificates=self.ssl_ca_pem,
                                            private_key=self.ssl_key_pem,
                                            certificate_chain=self.ssl_certificate_pem)

    def call_metadata(self) -> tuple[tuple[str, str], ...]:
        """The metadata every call carries: the Basic authorization with SASL, else none."""
        if not self.uses_sasl:
            return ()
        token = base64.b64encode(f"{self.sasl_username}:{self.sasl_password}".encode())
        return ((AUTHORIZATION_KEY, f"Basic {token.decode('ascii')}"),)


def _one_of(name: str, value: str | None, alias: str | None) -> str | None:
    if value is not None and alias is not None and value != alias:
        raise errors.InvalidConfigError(
            f"{name} and its kafka-python alias sasl_plain_{name.split('.')[1]} differ")
    return value if value is not None else alias


def _read_pem(name: str, path: str, kind: str) -> bytes:
    """The PEM file `name` gives, checked to hold a `kind` block (CERTIFICATE, PRIVATE KEY)."""
    try:
        with open(path, "rb") as f:
            data = f.read(PEM_BYTES_MAX + 1)
    except OSError as e:
        raise errors.InvalidConfigError(
            f"{name}: cannot read {path}: {e.strerror or e}") from None
    if len(data) > PEM_BYTES_MAX:
        raise errors.InvalidConfigError(
            f"{name}: {path} is more than {PEM_BYTES_MAX} bytes: not a PEM {kind.lower()}")
    if re.search(rb"-----BEGIN [A-Z ]*" + kind.encode() + rb"-----", data) is None:
        raise errors.InvalidConfigError(
            f"{name}: {path} holds no PEM {kind.lower()} ('-----BEGIN {kind}-----'): deltabus "
            "takes PEM files, not Java key stores or PKCS#12")
    if b"ENCRYPTED" in data and kind == "PRIVATE KEY":
        raise errors.InvalidConfigError(
            f"{name}: {path} is an encrypted key: give it unencrypted (deltabus has no "
            "ssl.key.password)")
    return data


def parse_jaas_config(text: str) -> tuple[str, str]:
    """(username, password) of Kafka's `sasl.jaas.config`: one PlainLoginModule or
    ScramLoginModule entry, `<module> required username="..." password="...";`. Errors never
    quote the text (it holds the password)."""
    tokens = _jaas_tokens(text)
    if len(tokens) < 3 or tokens[-1] != (";", "op"):
        raise errors.InvalidConfigError(
            "sasl.jaas.config does not parse: expected '<LoginModule> required "
            "username=\"...\" password=\"...\";'")
    (module, kind), (flag, _) = tokens[0], tokens[1]
    if kind != "word" or module not in LOGIN_MODULES:
        raise errors.InvalidConfigError(
            f"sasl.jaas.config: login module {module if kind == 'word' else '?'} is not one "
            "deltabus clients take: use PlainLoginModule or ScramLoginModule")
    if flag.lower() not in JAAS_FLAGS:
        raise errors.InvalidConfigError(
            f"sasl.jaas.config: the control flag must be one of {', '.join(JAAS_FLAGS)}")
    options = _jaas_options(tokens[2:-1])
    username, password = options.get("username"), options.get("password")
    if not username or not password:
        raise errors.InvalidConfigError(
            "sasl.jaas.config needs username=\"...\" and password=\"...\"")
    return username, password


def _jaas_tokens(text: str) -> list[tuple[str, str]]:
    """(value, kind) pairs: kind is word, quoted (unescaped) or op (= or ;)."""
    tokens: list[tuple[str, str]] = []
    position, end = 0, len(text.rstrip())
    while position < end:
        match = _JAAS_TOKEN.match(text, position)
        if match is None:
            raise errors.InvalidConfigError(
                f"sasl.jaas.config does not parse at character {position} (an unclosed quote?)")
        kind = str(match.lastgroup)
        value = match.group(kind)
        if kind == "quoted":
            value = re.sub(r"\\(.)", lambda m: _JAAS_ESCAPES.get(m.group(1), m.group(1)),
                           value[1:-1], flags=re.DOTALL)
        tokens.append((value, kind))
        position = match.end()
    return tokens


def _jaas_options(tokens: list[tuple[str, str]]) -> dict[str, str]:
    """key=value options (a value quoted or a bare word) up to the entry's closing `;`."""
    if (";", "op") in tokens:
        raise errors.InvalidConfigError(
            "sasl.jaas.config holds more than one login module entry: deltabus takes one")
    options = {}
    for i in range(0, len(tokens), 3):
        key, equals, value = (tokens[i:i + 3] + [("", "")] * 3)[:3]
        if key[1] != "word" or equals != ("=", "op") or value[1] not in ("word", "quoted"):
            raise errors.InvalidConfigError(
                "sasl.jaas.config does not parse: options must be key=\"value\"")
        options[key[0]] = value[0]
    return options


def refuse_java_stores(properties: Mapping[str, Any], *, prefix: str = "") -> None:
    """InvalidConfigError for Java's key and trust store settings, naming the PEM setting to
    give instead (a Kafka user's config often carries them)."""
    for java, pem in JAVA_STORE_PROPERTIES.items():
        if properties.get(prefix + java):
            raise errors.InvalidConfigError(
                f"{prefix}{java} is Java's key or trust store setting: deltabus takes PEM files, "
                f"give {' and '.join(prefix + p for p in pem.split(' and '))}")


def security_from_properties(properties: Mapping[str, Any], *,
                             prefix: str = "") -> ClientSecurity:
    """A ClientSecurity from Kafka's property names (`security.protocol`, ...), each behind
    `prefix` (Spark's options take `kafka.`). Java's key and trust stores are refused with
    the PEM setting to give instead; other properties are left to the caller."""
    refuse_java_stores(properties, prefix=prefix)
    settings = {keyword: properties[prefix + name] for name, keyword in SECURITY_PROPERTIES.items()
                if properties.get(prefix + name) not in (None, "")}
    try:
        return ClientSecurity.from_settings(**settings)
    except errors.InvalidConfigError as e:
        if not prefix:
            raise
        # name the settings as the caller gave them (kafka.security.protocol in Spark)
        raise errors.InvalidConfigError(_SETTING_NAME.sub(prefix + r"\1", e.message)) from None
