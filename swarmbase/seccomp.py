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
from functools import lru_cache

ALLOW = 0x7FFF0000
_ERRNO = 0x00050000

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
    names = PROFILES[profile]
    lib = _lib()
    ctx = lib.seccomp_init(ALLOW)
    if not ctx:
        raise SeccompUnavailable("seccomp_init failed")
    try:
        for name in names:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:          # not a call on this architecture (e.g. iopl on arm64)
                continue
            rc = lib.seccomp_rule_add_array(ctx, _ERRNO | errno.EPERM, nr, 0, None)
            if rc < 0:
                raise SeccompUnavailable(f"libseccomp refused a rule for {name}: {os.strerror(-rc)}")
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
