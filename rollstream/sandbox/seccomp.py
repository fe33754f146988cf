"""The seccomp filter of every bwrap sandbox: no new user namespaces, whoever runs it.

Under a non-root owner bwrap's --disable-userns already forbids them; as root there is no user
namespace to disable, and a nested user namespace is where most kernel privilege escalations
start. The filter (classic BPF, as bwrap's --seccomp takes it) refuses unshare and clone with
CLONE_NEWUSER (EPERM) and clone3, whose flags a filter cannot read (ENOSYS: libc falls back to
clone, as under Flatpak). A syscall of another ABI (32-bit, x32) kills the process, so the
filter cannot be gone around.
"""

from __future__ import annotations

import os
import platform
import struct

CLONE_NEWUSER = 0x10000000
_EPERM, _ENOSYS = 1, 38
_X32_BIT = 0x40000000
# audit arch, and the numbers of unshare, clone, clone3
_ARCHES = {"x86_64": (0xC000003E, 272, 56, 435), "aarch64": (0xC00000B7, 97, 220, 435)}

_LD_ABS_W, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _ERRNO, _KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (arg0's low half first)


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program() -> bytes | None:
    """The filter as bwrap reads it (struct sock_filter[]), or None on an unknown machine."""
    arch = _ARCHES.get(platform.machine())
    if arch is None:
        return None
    audit_arch, unshare, clone, clone3 = arch
    return b"".join([
        _op(_LD_ABS_W, _ARCH),
        _op(_JEQ, audit_arch, jt=1),
        _op(_RET, _KILL_PROCESS),
        _op(_LD_ABS_W, _NR),
        _op(_JGE, _X32_BIT, jt=8),  # -> ENOSYS
        _op(_JEQ, clone3, jt=7),  # -> ENOSYS
        _op(_JEQ, unshare, jt=2),  # -> flags
        _op(_JEQ, clone, jt=1),  # -> flags
        _op(_RET, _ALLOW),
        _op(_LD_ABS_W, _ARG0),
        _op(_JSET, CLONE_NEWUSER, jf=1),
        _op(_RET, _ERRNO | _EPERM),
        _op(_RET, _ALLOW),
        _op(_RET, _ERRNO | _ENOSYS),
    ])


def filter_fd() -> int | None:
    """A fresh inheritable descriptor holding the filter (bwrap reads it to the end)."""
    code = program()
    if code is None:
        return None
    fd = os.memfd_create("seccomp", 0)
    os.write(fd, code)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
