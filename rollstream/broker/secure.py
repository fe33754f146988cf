"""The bundled broker secured as production clusters are: SASL_SSL with SCRAM-SHA-512 for
clients and between brokers, TLS with client certificates on the controller listener, and the
KRaft StandardAuthorizer denying whatever no ACL allows.

Clients may also log in with SCRAM-SHA-256 or PLAIN on the SASL_SSL listener, or present a
certificate from the broker's CA on a mutual-TLS listener (their principal: ``User:CN=NAME``),
as the clusters teams run offer them.

Made locally, once, under the secured broker's home (``tls/``, files readable by their owner
only): a CA, one certificate for every node (127.0.0.1 and localhost), the admin super user's
password, and ``admin.properties``, the admin's client properties for ``--kafka-config``.
Other principals get SCRAM users and prefixed ACLs at run time (`rollstream acl`), client
certificates from `rollstream broker client-cert`, and PLAIN users from
``plain-users.properties`` in the home (read at start: PLAIN keeps its users in the broker's
configuration).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ADMIN = "admin"
MECHANISM = "SCRAM-SHA-512"
BROKER_CN = "rollstream-broker"  # the nodes' principal on the controller listener: User:CN=...
CLIENT_LISTENER = "SASL_SSL"
# Every mechanism a client may log in with on CLIENT_LISTENER; MECHANISM is also the brokers'.
CLIENT_MECHANISMS = (MECHANISM, "SCRAM-SHA-256", "PLAIN")
MTLS_LISTENER = "MTLS"  # TLS with a required client certificate: the certificate authenticates
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.-]+")  # what a JAAS line holds unquoted and unescaped
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


@dataclass(frozen=True)
class Material:
    """The secured broker's certificates and admin credential, in `folder`."""

    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def keystore(self) -> Path:
        """The nodes' private key and certificate chain (Kafka's PEM keystore)."""
        return self.folder / "broker.pem"

    @property
    def ca_key(self) -> Path:
        """The CA's private key: it signs client certificates (`issue_client_certificate`)."""
        return self.folder / "ca-key.pem"

    @property
    def admin_properties(self) -> Path:
        return self.folder.parent / "admin.properties"

    @property
    def plain_users(self) -> Path:
        """PLAIN's users, `name=password` lines, read at the broker's start."""
        return self.folder.parent / "plain-users.properties"

    def admin_password(self) -> str:
        return (self.folder / "admin.secret").read_text().strip()

    def client_properties(self, bootstrap: str, user: str, password: str) -> dict[str, str]:
        """librdkafka's properties for `user` on this broker."""
        return {"bootstrap.servers": bootstrap, "security.protocol": CLIENT_LISTENER,
                "sasl.mechanism": MECHANISM, "sasl.username": user, "sasl.password": password,
                "ssl.ca.location": str(self.ca)}

    def admin_conf(self, bootstrap: str) -> dict[str, str]:
        return self.client_properties(bootstrap, ADMIN, self.admin_password())

    def write_admin_properties(self, bootstrap: str) -> Path:
        lines = ["# The secured bundled broker's super user (rollstream --kafka-config FILE)."]
        lines += [f"{k}={v}" for k, v in self.admin_conf(bootstrap).items()]
        _write_private(self.admin_properties, "\n".join(lines) + "\n")
        return self.admin_properties

    def certificate_properties(self, bootstrap: str, certificate: Path,
                               key: Path) -> dict[str, str]:
        """librdkafka's properties for the holder of a client certificate, on the mutual-TLS
        listener (`bootstrap`: its addresses)."""
        return {"bootstrap.servers": bootstrap, "security.protocol": "SSL",
                "ssl.ca.location": str(self.ca), "ssl.certificate.location": str(certificate),
                "ssl.key.location": str(key)}

    def listener_lines(self, node: dict[str, Any], host: str) -> list[str]:
        """`node`'s listeners; its ports: port (SASL_SSL), controller_port, mtls_port."""
        listeners = (f"{CLIENT_LISTENER}://{host}:{node['port']},"
                     f"CONTROLLER://{host}:{node['controller_port']},"
                     f"{MTLS_LISTENER}://{host}:{node['mtls_port']}")
        return [
            f"listeners={listeners}",
            f"advertised.listeners={listeners}",
            f"listener.security.protocol.map={CLIENT_LISTENER}:SASL_SSL,CONTROLLER:SSL,"
            f"{MTLS_LISTENER}:SSL",
            "controller.listener.names=CONTROLLER",
            f"inter.broker.listener.name={CLIENT_LISTENER}",
        ]

    def read_plain_users(self) -> dict[str, str]:
        """PLAIN's users (none while the file is absent)."""
        if not self.plain_users.is_file():
            return {}
        from rollstream.config import read_properties

        users = read_properties(self.plain_users)
        bad = sorted(k for k, v in users.items()
                     if not (_PLAIN_NAME.fullmatch(k) and _PLAIN_NAME.fullmatch(v)))
        if bad:
            raise ValueError(f"{self.plain_users}: users {bad}: a PLAIN user's name and password "
                             "are letters, digits, '_', '.' and '-'")
        return users

    def broker_settings(self) -> dict[str, str]:
        listener = f"listener.name.{CLIENT_LISTENER.lower()}"
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule required"
        plain = "org.apache.kafka.common.security.plain.PlainLoginModule required" + "".join(
            f' user_{name}="{password}"' for name, password in self.read_plain_users().items())
        return {
            "sasl.enabled.mechanisms": ",".join(CLIENT_MECHANISMS),
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            # The brokers log in to each other as the admin.
            f"{listener}.{MECHANISM.lower()}.sasl.jaas.config":
                f'{scram} username="{ADMIN}" password="{self.admin_password()}";',
            f"{listener}.scram-sha-256.sasl.jaas.config": f"{scram};",
            f"{listener}.plain.sasl.jaas.config": f"{plain};",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca),
            # Only a node's certificate opens the controller listener.
            "listener.name.controller.ssl.client.auth": "required",
            f"listener.name.{MTLS_LISTENER.lower()}.ssl.client.auth": "required",
            "authorizer.class.name": AUTHORIZER,
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{ADMIN};User:CN={BROKER_CN}",
        }

    def format_args(self) -> list[str]:
        """The SCRAM users the brokers need themselves: they must exist before the first start."""
        return ["--add-scram", f"{MECHANISM}=[name={ADMIN},password={self.admin_password()}]"]

    def issue_client_certificate(self, name: str, out: Path) -> tuple[Path, Path]:
        """A certificate for principal `User:CN=name`, signed by the broker's CA, in `out`:
        NAME.pem and NAME.key (readable by their owner only)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID

        if not _PLAIN_NAME.fullmatch(name):
            raise ValueError(f"certificate name {name!r}: letters, digits, '_', '.' and '-'")
        if not self.ca_key.is_file():
            raise ValueError(f"{self.folder} holds no CA key (made before client certificates "
                             "were): stop the secured broker and delete the folder to remake it")
        ca_key = serialization.load_pem_private_key(self.ca_key.read_bytes(), None)
        ca = x509.load_pem_x509_certificate(self.ca.read_bytes())
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _signed(_builder(name, ca.subject, key).add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False), ca_key)
        out.mkdir(parents=True, exist_ok=True)
        paths = out / f"{name}.pem", out / f"{name}.key"
        _write_private(paths[0], _pem(cert) + _pem(ca))
        _write_private(paths[1], _key_pem(key))
        return paths


def material(folder: Path) -> Material:
    """The secured broker's material in `folder`, made there on first use."""
    found = Material(folder)
    if not (found.keystore.is_file() and found.ca.is_file()
            and (folder / "admin.secret").is_file()):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        _make(found)
    return found


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def _builder(cn: str, issuer: Any, key: Any) -> Any:
    """A certificate for `cn`, valid from yesterday for ten years."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(issuer).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=3650)))


def _signed(builder: Any, ca_key: Any) -> Any:
    from cryptography.hazmat.primitives import hashes

    return builder.sign(ca_key, hashes.SHA256())


def _pem(cert: Any) -> str:
    from cryptography.hazmat.primitives import serialization

    return str(cert.public_bytes(serialization.Encoding.PEM).decode())


def _key_pem(key: Any) -> str:
    from cryptography.hazmat.primitives import serialization

    return str(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption()).decode())


def _make(found: Material) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rollstream-local-ca")])
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _signed(
        _builder("rollstream-local-ca", ca_name, ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True),
        ca_key)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _signed(
        _builder(BROKER_CN, ca.subject, key)
        .add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
        # Server to clients, and client to the controller listener.
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False),
        ca_key)
    _write_private(found.keystore, _key_pem(key) + _pem(cert) + _pem(ca))
    _write_private(found.ca, _pem(ca))
    _write_private(found.ca_key, _key_pem(ca_key))
    # Letters and digits only: the password sits in a JAAS line and a StorageTool argument.
    _write_private(found.folder / "admin.secret", secrets.token_hex(24) + "\n")
