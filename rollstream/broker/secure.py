"""The bundled broker secured as production clusters are: SASL_SSL with SCRAM-SHA-512 for
clients and between brokers, TLS with client certificates on the controller listener, and the
KRaft StandardAuthorizer denying whatever no ACL allows.

Made locally, once, under the secured broker's home (``tls/``, files readable by their owner
only): a CA, one certificate for every node (127.0.0.1 and localhost), the admin super user's
password, and ``admin.properties``, the admin's client properties for ``--kafka-config``.
Other principals get SCRAM users and prefixed ACLs at run time (`rollstream acl`).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

ADMIN = "admin"
MECHANISM = "SCRAM-SHA-512"
BROKER_CN = "rollstream-broker"  # the nodes' principal on the controller listener: User:CN=...
CLIENT_LISTENER = "SASL_SSL"
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
    def admin_properties(self) -> Path:
        return self.folder.parent / "admin.properties"

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

    def listener_lines(self, port: int, controller_port: int, host: str) -> list[str]:
        return [
            f"listeners={CLIENT_LISTENER}://{host}:{port},CONTROLLER://{host}:{controller_port}",
            f"advertised.listeners={CLIENT_LISTENER}://{host}:{port},"
            f"CONTROLLER://{host}:{controller_port}",
            f"listener.security.protocol.map={CLIENT_LISTENER}:SASL_SSL,CONTROLLER:SSL",
            "controller.listener.names=CONTROLLER",
            f"inter.broker.listener.name={CLIENT_LISTENER}",
        ]

    def broker_settings(self) -> dict[str, str]:
        jaas = (f'org.apache.kafka.common.security.scram.ScramLoginModule required '
                f'username="{ADMIN}" password="{self.admin_password()}";')
        return {
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            f"listener.name.{CLIENT_LISTENER.lower()}.{MECHANISM.lower()}.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca),
            # Only a node's certificate opens the controller listener.
            "listener.name.controller.ssl.client.auth": "required",
            "authorizer.class.name": AUTHORIZER,
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{ADMIN};User:CN={BROKER_CN}",
        }

    def format_args(self) -> list[str]:
        """The SCRAM users the brokers need themselves: they must exist before the first start."""
        return ["--add-scram", f"{MECHANISM}=[name={ADMIN},password={self.admin_password()}]"]


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


def _make(found: Material) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(days=1), now + datetime.timedelta(days=3650))

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("rollstream-local-ca"))
          .issuer_name(name("rollstream-local-ca")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(valid[0])
          .not_valid_after(valid[1])
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(name(BROKER_CN)).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(valid[0]).not_valid_after(valid[1])
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            # Server to clients, and client to the controller listener.
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    _write_private(found.keystore, key_pem + cert.public_bytes(pem).decode()
                   + ca.public_bytes(pem).decode())
    _write_private(found.ca, ca.public_bytes(pem).decode())
    # Letters and digits only: the password sits in a JAAS line and a StorageTool argument.
    _write_private(found.folder / "admin.secret", secrets.token_hex(24) + "\n")
