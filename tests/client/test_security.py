"""Client security settings are checked when a client is made: a bad one is one InvalidConfigError
naming Kafka's setting, and the password never shows in a repr or an error. No server here
(tests/client/test_secure_channels.py puts them on the wire)."""

from __future__ import annotations

import base64
import pathlib
import pickle

import pytest
import trustme
from hypothesis import given
from hypothesis import strategies as st

from deltabus import errors
from deltabus.client import AdminClient, ExactlyOncePipeline, Producer
from deltabus.client.security import (
    AUTHORIZATION_KEY,
    ClientSecurity,
    parse_jaas_config,
    security_from_properties,
)

SECRET = "s3cret-Pa55"
SCRAM_JAAS = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
              f'username="alice" password="{SECRET}";')


@pytest.fixture(scope="module")
def pems(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A CA's certificate and a client certificate with its key, as PEM files."""
    folder = tmp_path_factory.mktemp("pems")
    ca = trustme.CA()
    client = ca.issue_cert("client.example", common_name="alice")
    paths = {"ca": folder / "ca.pem", "cert": folder / "client.pem", "key": folder / "key.pem"}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    client.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    client.private_key_pem.write_to_path(str(paths["key"]))
    return {name: str(path) for name, path in paths.items()}


def decoded_basic(security: ClientSecurity) -> str:
    [(key, value)] = security.call_metadata()
    assert key == AUTHORIZATION_KEY and value.startswith("Basic ")
    return base64.b64decode(value.removeprefix("Basic "), validate=True).decode()


def test_the_default_is_plaintext_with_nothing_added_to_calls() -> None:
    security = ClientSecurity.from_settings()
    assert security.security_protocol == "PLAINTEXT"
    assert not security.uses_tls and not security.uses_sasl
    assert security.call_metadata() == ()


def test_sasl_calls_carry_basic_authorization_of_user_and_password() -> None:
    security = ClientSecurity.from_settings(security_protocol="sasl_plaintext",
                                            sasl_mechanism="scram-sha-512",
                                            sasl_username="alice", sasl_password=SECRET)
    assert (security.security_protocol, security.sasl_mechanism) == (
        "SASL_PLAINTEXT", "SCRAM-SHA-512")
    assert decoded_basic(security) == f"alice:{SECRET}"


@given(st.text(min_size=1).filter(lambda u: ":" not in u), st.text(min_size=1))
def test_basic_authorization_is_utf8_user_colon_password(username: str, password: str) -> None:
    """RFC 7617: base64 of the UTF-8 bytes of user:password; the password may hold ':'."""
    security = ClientSecurity.from_settings(security_protocol="SASL_PLAINTEXT",
                                            sasl_username=username, sasl_password=password)
    [(_, value)] = security.call_metadata()
    assert value.isascii()
    user, _, secret = decoded_basic(security).partition(":")
    assert (user, secret) == (username, password)


@pytest.mark.parametrize(("settings", "named"), [
    ({"security_protocol": "TLS"}, "security.protocol"),
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI", "sasl_username": "a",
      "sasl_password": SECRET}, "sasl.mechanism"),
    ({"security_protocol": "SASL_SSL"}, "sasl.username"),
    ({"security_protocol": "SASL_SSL", "sasl_username": "alice"}, "sasl.password"),
    ({"security_protocol": "SASL_PLAINTEXT", "sasl_username": "al:ice",
      "sasl_password": SECRET}, "sasl.username"),
    ({"sasl_username": "alice", "sasl_password": SECRET}, "sasl.username"),
    ({"security_protocol": "SASL_PLAINTEXT", "sasl_password": SECRET}, "sasl.username"),
    ({"ssl_ca_location": "/etc/hosts"}, "ssl.ca.location"),
    ({"security_protocol": "SSL", "ssl_ca_location": "/no/such/ca.pem"}, "ssl.ca.location"),
    ({"security_protocol": "SSL", "ssl_ca_location": "/etc/hosts"}, "ssl.ca.location"),
    ({"security_protocol": "SASL_SSL", "sasl_jaas_config": "nonsense",
      "sasl_password": SECRET}, "sasl.jaas.config"),
    ({"security_protocol": "SASL_SSL", "sasl_username": "alice", "sasl_password": SECRET,
      "sasl_plain_password": "other"}, "sasl.password"),
])
def test_a_bad_setting_is_one_invalid_config_line_naming_it(settings: dict, named: str) -> None:
    with pytest.raises(errors.InvalidConfigError) as info:
        ClientSecurity.from_settings(**settings)
    message = str(info.value)
    assert named in message and "\n" not in message
    assert SECRET not in message


def test_the_clients_refuse_bad_security_settings_when_made() -> None:
    """Before any connection: the constructors check them."""
    with pytest.raises(errors.InvalidConfigError, match="sasl.username"):
        Producer("127.0.0.1:1", security_protocol="SASL_SSL")
    with pytest.raises(errors.InvalidConfigError, match="security.protocol"):
        AdminClient("127.0.0.1:1", security_protocol="KERBEROS")
    with pytest.raises(errors.InvalidConfigError, match="sasl.mechanism"):
        ExactlyOncePipeline("127.0.0.1:1", "g", "in", "out", lambda r: [],
                            security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
                            sasl_username="alice", sasl_password=SECRET)


def test_tls_files_are_read_when_made_and_travel_with_the_settings(
        pems: dict[str, str], tmp_path: pathlib.Path) -> None:
    """A Spark executor gets the PEM bytes with the pickled options: it needs no file."""
    ca = tmp_path / "ca.pem"
    ca.write_bytes(pathlib.Path(pems["ca"]).read_bytes())
    security = ClientSecurity.from_settings(
        security_protocol="SSL", ssl_ca_location=str(ca),
        ssl_certificate_location=pems["cert"], ssl_key_location=pems["key"])
    ca.unlink()
    copy = pickle.loads(pickle.dumps(security))
    assert copy == security
    assert copy.ssl_ca_pem is not None and b"BEGIN CERTIFICATE" in copy.ssl_ca_pem
    assert copy.ssl_key_pem is not None and b"PRIVATE KEY" in copy.ssl_key_pem
    copy.channel_credentials()


def test_ssl_without_a_ca_trusts_the_system_roots() -> None:
    security = ClientSecurity.from_settings(security_protocol="SSL")
    assert security.ssl_ca_pem is None
    security.channel_credentials()


def test_a_client_certificate_needs_its_key(pems: dict[str, str]) -> None:
    with pytest.raises(errors.InvalidConfigError, match="ssl.key.location"):
        ClientSecurity.from_settings(security_protocol="SSL",
                                     ssl_certificate_location=pems["cert"])
    with pytest.raises(errors.InvalidConfigError, match="ssl.key.location.*holds no PEM"):
        ClientSecurity.from_settings(security_protocol="SSL", ssl_certificate_location=pems["cert"],
                                     ssl_key_location=pems["cert"])


def test_an_encrypted_key_is_refused_by_name(tmp_path: pathlib.Path,
                                             pems: dict[str, str]) -> None:
    key = tmp_path / "encrypted.pem"
    key.write_text("-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n"
                   "-----END ENCRYPTED PRIVATE KEY-----\n")
    with pytest.raises(errors.InvalidConfigError, match="ssl.key.location.*encrypted"):
        ClientSecurity.from_settings(security_protocol="SSL", ssl_certificate_location=pems["cert"],
                                     ssl_key_location=str(key))


def test_the_password_and_key_stay_out_of_repr(pems: dict[str, str]) -> None:
    security = ClientSecurity.from_settings(
        security_protocol="SASL_SSL", sasl_jaas_config=SCRAM_JAAS, ssl_ca_location=pems["ca"],
        ssl_certificate_location=pems["cert"], ssl_key_location=pems["key"])
    text = repr(security) + str(security)
    assert "alice" in text and pems["key"] in text
    assert SECRET not in text and "PRIVATE KEY" not in text


# ---- sasl.jaas.config ---------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    SCRAM_JAAS,
    SCRAM_JAAS.replace("scram.ScramLoginModule", "plain.PlainLoginModule"),
    # as a properties file continues it over lines, and with the options the other way round
    'org.apache.kafka.common.security.scram.ScramLoginModule required\n'
    f'    password="{SECRET}"\n    username="alice";  ',
    # bare words, another control flag, an option deltabus does not use
    'org.apache.kafka.common.security.plain.PlainLoginModule REQUIRED username=alice '
    f'password={SECRET} serviceName="kafka" ;',
])
def test_kafkas_jaas_forms_give_username_and_password(text: str) -> None:
    assert parse_jaas_config(text) == ("alice", SECRET)


def test_jaas_quoted_values_take_escapes_and_any_character() -> None:
    text = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
            r'username="al ice" password="p=a;s\"s\\w";')
    assert parse_jaas_config(text) == ("al ice", 'p=a;s"s\\w')


@pytest.mark.parametrize(("text", "says"), [
    (SCRAM_JAAS.rstrip(";"), "does not parse"),
    ("com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true;",
     "Krb5LoginModule"),
    (SCRAM_JAAS.replace("required", "maybe"), "control flag"),
    (SCRAM_JAAS + " " + SCRAM_JAAS, "more than one"),
    (SCRAM_JAAS.replace(f' password="{SECRET}"', ""), "password"),
    (SCRAM_JAAS.replace(f'"{SECRET}"', f'"{SECRET}'), "unclosed"),
    (SCRAM_JAAS.replace(f'password="{SECRET}"', f'password "{SECRET}"'), "key="),
])
def test_a_bad_jaas_config_says_why_without_quoting_it(text: str, says: str) -> None:
    with pytest.raises(errors.InvalidConfigError) as info:
        parse_jaas_config(text)
    assert says in str(info.value) and "sasl.jaas.config" in str(info.value)
    assert SECRET not in str(info.value)


def test_jaas_config_and_username_are_one_or_the_other() -> None:
    with pytest.raises(errors.InvalidConfigError, match="not both"):
        ClientSecurity.from_settings(security_protocol="SASL_SSL", sasl_jaas_config=SCRAM_JAAS,
                                     sasl_username="alice")


def test_kafka_python_names_are_aliases() -> None:
    security = ClientSecurity.from_settings(security_protocol="SASL_PLAINTEXT",
                                            sasl_plain_username="alice",
                                            sasl_plain_password=SECRET)
    assert (security.sasl_username, security.sasl_password) == ("alice", SECRET)


def test_a_made_security_is_taken_alone() -> None:
    made = ClientSecurity.from_settings(security_protocol="SASL_PLAINTEXT",
                                        sasl_username="alice", sasl_password=SECRET)
    assert ClientSecurity.from_settings(made) is made
    with pytest.raises(errors.InvalidConfigError, match="not both"):
        ClientSecurity.from_settings(made, sasl_username="bob")


# ---- Kafka's property names ---------------------------------------------------------------------

def test_properties_with_a_prefix_as_spark_gives_them(pems: dict[str, str]) -> None:
    security = security_from_properties({
        "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "SCRAM-SHA-256",
        "kafka.sasl.jaas.config": SCRAM_JAAS, "kafka.ssl.ca.location": pems["ca"],
        "subscribe": "payments", "security.protocol": "not mine: no prefix"}, prefix="kafka.")
    assert (security.security_protocol, security.sasl_mechanism, security.sasl_username) == (
        "SASL_SSL", "SCRAM-SHA-256", "alice")
    assert security.ssl_ca_location == pems["ca"]


def test_librdkafka_names_are_taken() -> None:
    security = security_from_properties({
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "alice", "sasl.password": SECRET})
    assert security.sasl_mechanism == "SCRAM-SHA-512"
    assert decoded_basic(security) == f"alice:{SECRET}"


@pytest.mark.parametrize(("java", "instead"), [
    ("ssl.truststore.location", "ssl.ca.location"),
    ("ssl.keystore.location", "ssl.key.location"),
    ("ssl.key.password", "unencrypted"),
])
def test_java_stores_are_refused_naming_the_pem_setting(java: str, instead: str) -> None:
    with pytest.raises(errors.InvalidConfigError) as info:
        security_from_properties({"kafka.security.protocol": "SSL",
                                  f"kafka.{java}": "/etc/kafka/store.jks"}, prefix="kafka.")
    assert f"kafka.{java}" in str(info.value) and "PEM" in str(info.value)
    assert instead in str(info.value)
