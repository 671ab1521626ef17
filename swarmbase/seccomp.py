"""The seccomp filter every sandboxed child gets (bubblewrap's `--seccomp FD`): calls no
agent, runner or git needs, and that reach the kernel's most dangerous parts, fail with
EPERM.

Design log:
- Built with libseccomp (through ctypes), the library systemd, bubblewrap's own callers
  (flatpak) and container runtimes use: it knows every architecture's syscall numbers,
  rejects other ABIs (x32, i386 via int 0x80) with the filter's bad-arch action, and
  emits the classic BPF program bwrap loads. Rejected: Debian's python3-seccomp (it is
  not importable from a venv or pipx install, and PyPI has no official build), and a BPF
  program assembled here (it would carry our own syscall tables and arch checks — the
  part that is easy to get wrong). libseccomp2 is on every systemd distribution.
- Two profiles. `strict` (runners, claude agents, git): no mounts of any kind, no new
  namespaces, no kexec/modules/bpf/perf, no keyrings, no ptrace or cross-process memory
  access, no clock or swap or quota changes, no io_uring. `nesting` (codex agents): the
  same except mounts and namespaces, because the codex CLI builds its own bubblewrap
  sandbox inside ours (a user namespace, mounts, pivot_root); it still runs without any
  capability in the host's namespaces.
- No setuid or setgid file from a sandbox, in either profile (systemd's RestrictSUIDSGID,
  the same rules): chmod/fchmod/fchmodat/fchmodat2 with S_ISUID or S_ISGID in the mode,
  open/openat/creat making a file (O_CREAT, O_TMPFILE) with them, and mknod/mknodat with
  them are refused. A planted setuid copy of a binary would let any local account become
  the sandbox's uid and read its agents' /proc/<pid>/environ. openat2 passes its mode in
  a struct a filter cannot read, so it answers ENOSYS (libc and runtimes fall back to
  openat), as under systemd.
- No AF_VSOCK socket in either profile (vsock is not namespaced: it reaches the
  hypervisor and other guests). The nesting profile's child has capabilities inside the
  user namespace it builds, so it also gets no AF_PACKET socket (raw frames) and no
  NETLINK_NETFILTER one (nftables/conntrack); the strict profile's child has no
  capability anywhere, and the kernel already refuses both.
- EPERM rather than a kill: a CLI probing for a feature (io_uring, keyrings) falls back.
- Measured: building a profile takes about 1 ms; it is built once per profile and the
  bytes reused (a fresh memfd per child, since bwrap reads the program from the fd's
  offset).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
import stat
from functools import lru_cache

import attrs

ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
# enum scmp_compare
_EQ = 4
_MASKED_EQ = 7
SETID_BITS = (stat.S_ISUID, stat.S_ISGID)
AF_VSOCK, AF_PACKET, AF_NETLINK, NETLINK_NETFILTER = 40, 17, 16, 12
# Calls libseccomp may not know yet (2.5.4 has no fchmodat2): their number in the unified
# table new calls share since Linux 5.x, on the architectures where that table is used
# unshifted (not MIPS or alpha, whose numbers are offset).
UNIFIED_NUMBERS = {"fchmodat2": 452} if platform.machine() in ("x86_64", "aarch64", "riscv64", "i686") else {}

ALWAYS_DENIED = (
    # the kernel itself
    "kexec_load", "kexec_file_load", "reboot", "init_module", "finit_module", "delete_module",
    "bpf", "perf_event_open", "iopl", "ioperm", "syslog", "uselib", "lookup_dcookie", "nfsservctl",
    "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "vhangup",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    # keyrings are keyed by uid, not by namespace
    "keyctl", "add_key", "request_key",
    # other processes' memory and files
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "open_by_handle_at", "name_to_handle_at",
    # large attack surface no child uses
    "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd",
)
MOUNTS_AND_NAMESPACES = (
    "mount", "umount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr", "unshare", "setns",
)
PROFILES = {
    "strict": ALWAYS_DENIED + MOUNTS_AND_NAMESPACES,
    "nesting": ALWAYS_DENIED,
}

Cmp = tuple[int, int, int, int]       # (argument index, scmp_compare, datum_a, datum_b)


@attrs.frozen
class Rule:
    """Refuse `call` with `err` when every comparison holds (none: always)."""
    call: str
    when: tuple[Cmp, ...] = ()
    err: int = errno.EPERM


def _has(arg: int, bits: int) -> Cmp:
    return (arg, _MASKED_EQ, bits, bits)


def _is(arg: int, value: int) -> Cmp:
    return (arg, _EQ, value, 0)


# Where each call carries the mode, and (open-like calls) the flags that make it create.
_MODE_ARG = {"chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2, "mknod": 1, "mknodat": 2}
_CREATE_ARGS = {"open": (1, 2), "openat": (2, 3)}
_CREATES = (os.O_CREAT, getattr(os, "O_TMPFILE", 0o20200000))


def _setid_rules() -> tuple[Rule, ...]:
    """RestrictSUIDSGID: one rule per (call, bit), since a rule's comparisons all must hold."""
    out = [Rule(call, (_has(arg, bit),)) for call, arg in _MODE_ARG.items() for bit in SETID_BITS]
    out += [Rule(call, (_has(flags, create), _has(mode, bit)))
            for call, (flags, mode) in _CREATE_ARGS.items() for create in _CREATES for bit in SETID_BITS]
    out += [Rule("creat", (_has(1, bit),)) for bit in SETID_BITS]
    out.append(Rule("openat2", err=errno.ENOSYS))
    return tuple(out)


SHARED_RULES = (*_setid_rules(), Rule("socket", (_is(0, AF_VSOCK),)))
NESTING_RULES = (Rule("socket", (_is(0, AF_PACKET),)), Rule("socket", (_is(0, AF_NETLINK), _is(2, NETLINK_NETFILTER))))


def rules(profile: str) -> tuple[Rule, ...]:
    """Every rule of a profile: its denied calls, then the argument-checked ones."""
    extra = NESTING_RULES if profile == "nesting" else ()
    return (*(Rule(name) for name in PROFILES[profile]), *SHARED_RULES, *extra)


class _ArgCmp(ctypes.Structure):
    """struct scmp_arg_cmp"""
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


class SeccompUnavailable(RuntimeError):
    """libseccomp cannot be loaded or refused the filter; the message says why."""


@lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as e:
        raise SeccompUnavailable(f"libseccomp is not installed ({e}); install libseccomp2") from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


@lru_cache(maxsize=None)
def program(profile: str) -> bytes:
    """The BPF program (struct sock_filter[]) for a profile, as bwrap's --seccomp reads it."""
    lib = _lib()
    ctx = lib.seccomp_init(ALLOW)
    if not ctx:
        raise SeccompUnavailable("seccomp_init failed")
    try:
        for rule in rules(profile):
            nr = lib.seccomp_syscall_resolve_name(rule.call.encode())
            if nr < 0:
                nr = UNIFIED_NUMBERS.get(rule.call, -1)
            if nr < 0:          # not a call on this architecture (e.g. iopl on arm64)
                continue
            cmps = (_ArgCmp * max(1, len(rule.when)))(*(_ArgCmp(*c) for c in rule.when))
            rc = lib.seccomp_rule_add_array(ctx, _ERRNO | rule.err, nr, len(rule.when), cmps)
            if rc < 0:
                raise SeccompUnavailable(f"libseccomp refused a rule for {rule.call}: {os.strerror(-rc)}")
        out = os.memfd_create("swarmbase-seccomp-export", os.MFD_CLOEXEC)
        try:
            rc = lib.seccomp_export_bpf(ctx, out)
            if rc < 0:
                raise SeccompUnavailable(f"libseccomp could not export the filter: {os.strerror(-rc)}")
            size = os.lseek(out, 0, os.SEEK_END)
            return os.pread(out, size, 0)
        finally:
            os.close(out)
    finally:
        lib.seccomp_release(ctx)


def program_fd(profile: str) -> int:
    """A fresh fd holding the profile's program at offset 0 (the caller closes it)."""
    fd = os.memfd_create(f"swarmbase-seccomp-{profile}", os.MFD_CLOEXEC)
    try:
        os.write(fd, program(profile))
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
