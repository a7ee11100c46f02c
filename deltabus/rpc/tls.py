"""TLS for the listeners, from `ListenerSecurity`'s PEM material: the Kafka door's SSLContext,
the gRPC door's server credentials, the credentials brokers and the controller use to call each
other, and the principal a client certificate gives (Kafka's default: `User:` and the subject's
distinguished name, most specific part first, as RFC 2253 writes it).
"""

from __future__ import annotations

import os
import ssl
import tempfile
from typing import Any

import grpc

from deltabus.config import ListenerSecurity
from deltabus.security.principal import KafkaPrincipal

# X.509 attribute names as RFC 2253 abbreviates them (Python's ssl gives the long names).
_SHORT = {"commonName": "CN", "organizationalUnitName": "OU", "organizationName": "O",
          "localityName": "L", "stateOrProvinceName": "ST", "countryName": "C",
          "streetAddress": "STREET", "domainComponent": "DC", "userId": "UID"}


def server_ssl_context(security: ListenerSecurity) -> ssl.SSLContext:
    """The Kafka door's TLS: TLS 1.2 or later, client certificates as ssl.client.auth says."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # ssl loads a certificate chain and key only from files: a private, short-lived copy.
    with tempfile.TemporaryDirectory(prefix="deltabus-tls-") as folder:
        cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
        for path, data in ((cert, security.ssl_certificate), (key, security.ssl_key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        context.load_cert_chain(cert, key)
    if security.ssl_client_auth == "required":
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=security.ssl_ca.decode())
    return context


def grpc_server_credentials(security: ListenerSecurity) -> grpc.ServerCredentials:
    required = security.ssl_client_auth == "required"
    return grpc.ssl_server_credentials(
        [(security.ssl_key, security.ssl_certificate)],
        root_certificates=security.ssl_ca if required else None,
        require_client_auth=required)


def grpc_peer_credentials(security: ListenerSecurity) -> grpc.ChannelCredentials | None:
    """How a broker or the controller reaches another's gRPC listener: TLS trusting the cluster's
    CA (or the listeners' own certificate), presenting the listeners' certificate where client
    certificates are required. None on a plaintext cluster."""
    if not security.uses_tls:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=security.ssl_ca or security.ssl_certificate,
        private_key=security.ssl_key or None,
        certificate_chain=security.ssl_certificate or None)


def certificate_principal(peer_certificate: dict[str, Any] | None) -> KafkaPrincipal | None:
    """`User:CN=alice,OU=...` from a verified peer certificate (ssl's getpeercert() form)."""
    if not peer_certificate or not peer_certificate.get("subject"):
        return None
    parts = [f"{_SHORT.get(name, name)}={value}"
             for rdn in reversed(peer_certificate["subject"]) for name, value in rdn]
    return KafkaPrincipal("User", ",".join(parts))
