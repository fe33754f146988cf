"""The secured bundled broker in a home of its own, and principals on it holding only
`rollstream acl` grants: shared by the tests of the secured cluster and of jobs' isolation."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from rollstream import config
from rollstream.broker import local, secure
from rollstream.broker.secure import Material
from rollstream.cluster import acl

PLAIN_USER = "plainfleet"  # PLAIN's users are the broker's configuration, read at its start


@contextlib.contextmanager
def own_home(folder: Path) -> Iterator[None]:
    """ROLLSTREAM_HOME at `folder` (for this process and the commands it runs), sharing the
    project's broker jars."""
    with local.home_sharing_jars(folder), pytest.MonkeyPatch.context() as patch:
        patch.setenv(local.HEAP_ENV, os.environ.get(local.HEAP_ENV, "256m"))
        yield


@contextlib.contextmanager
def secured_broker(home: Path) -> Iterator[tuple[str, Material]]:
    """A secured single-node broker started fresh in `home` (its address and material), with
    the PLAIN user; stopped at the end."""
    with own_home(home), local.secured() as material:
        material.plain_users.write_text(f"{PLAIN_USER}={secrets.token_hex(12)}\n")
        bootstrap = local.start(timeout=180)
        try:
            yield bootstrap, material
        finally:
            local.stop()


def principal(bootstrap: str, material: Material, folder: Path, prefix: str,
              *roles: str, mechanism: str = secure.MECHANISM) -> tuple[Path, str]:
    """A principal granted `roles` on `prefix`, logging in with `mechanism` (a SCRAM one: a new
    user; PLAIN: the broker's PLAIN user; "SSL": a new client certificate): its properties file
    (named after the user) and its password (empty for a certificate)."""
    name, password = f"u{uuid.uuid4().hex[:8]}", secrets.token_hex(12)
    admin = AdminClient(material.admin_conf(bootstrap))
    if mechanism == "SSL":
        principal_name, password = f"User:CN={name}", ""
        made = cli("broker", "client-cert", name, "--out", str(folder))
        assert made.returncode == 0, made.stderr
        props = config.read_properties(Path(made.stdout.strip()))
        assert props["bootstrap.servers"] == local.status()["mtls_bootstrap"]
    else:
        if mechanism == "PLAIN":
            name, password = PLAIN_USER, material.read_plain_users()[PLAIN_USER]
        else:
            acl.set_password(admin, name, password, 30, mechanism)
        principal_name = f"User:{name}"
        props = {**material.client_properties(bootstrap, name, password),
                 "sasl.mechanism": mechanism}
    for role in roles:
        acl.grant(admin, principal_name, prefix, role, 30)
    path = folder / f"{name}.properties"
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return path, password


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rollstream.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("rollstream: ")]
    assert len(lines) == 1, proc.stderr
    return lines[0]
