"""The pieces of the no-privilege sandbox, each on its own: the sandbox user, the bwrap
command line (one stage or two), the seccomp filter (in a real child), launch-time
pinning, the git config that replaces a repository's, and finding a repository without
running git. Real processes where the kernel decides; pure functions elsewhere."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from swarmbase import identity, seccomp
from swarmbase.identity import SandboxUser
from swarmbase.launch.pins import LaunchRefused, pin
from swarmbase.runs.git_sandbox import sanitized
from swarmbase.runs.worktrees import WorktreeError, find_repository
from swarmbase.launch.sandbox import Confinement, HostLayout, bwrap_argv, interpreter_paths

LAYOUT = HostLayout(symlinks=(("/bin", "usr/bin"),), dirs=(), bwrap="/usr/bin/bwrap", setpriv="/usr/bin/setpriv")
NOBODY = SandboxUser(uid=65534, gid=65534, name="nobody")


def test_the_sandbox_user_is_never_root() -> None:
    assert identity.resolve(None, euid=1000) is None                 # a plain daemon: its own user
    assert identity.resolve(None, euid=0) is None                    # root: no shared user unless named
    assert identity.resolve("4242:4343", euid=0) == SandboxUser(uid=4242, gid=4343,
                                                                name=identity.resolve("4242:4343", euid=0).name)
    for bad in ("root", "0", "0:5", "5:0"):
        with pytest.raises(identity.IdentityError, match="unprivileged"):
            identity.resolve(bad, euid=0)
    with pytest.raises(identity.IdentityError, match="no user named"):
        identity.resolve("no-such-user-here", euid=0)


def test_each_caller_gets_a_uid_of_its_own_that_survives_a_restart(tmp_path: Path) -> None:
    r = identity.UidRange.parse("600000-600002")
    path = tmp_path / identity.ALLOCATIONS
    ids = identity.Identities(path, r)
    alice, bob = ids.user_for("alice"), ids.user_for("bob")
    assert (alice.uid, alice.gid, bob.uid) == (600001, 600001, 600002)      # the first is the daemon's own
    assert ids.runner().uid == 600000 and ids.user_for("alice") == alice
    assert path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(identity.IdentityError, match="is full"):
        ids.user_for("carol")
    again = identity.Identities(path, r)                                    # a restart: the same uids
    assert again.user_for("bob").uid == 600002 and again.user_for("alice").uid == 600001
    again.check()
    with pytest.raises(identity.IdentityError, match="outside sandboxUids"):
        identity.Identities(path, identity.UidRange.parse("700000-700999")).check()
    for bad in ("600000", "5-6000", "600000-600000", "x-y", "1000-4294967295"):
        with pytest.raises(identity.IdentityError, match="sandboxUids"):
            identity.UidRange.parse(bad)


def test_a_range_that_someone_uses_is_refused(tmp_path: Path) -> None:
    r = identity.UidRange.parse("600000-600999")
    assert identity.range_conflicts(r, [("www", 33), ("x", 600005)], [("g", 600999), ("h", 601000)]) == \
        ["user x (600005)", "group g (600999)"]
    if os.geteuid() != 0:
        return                     # chown to another uid needs root (CI runs as root)
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "theirs").mkdir()
    os.chown(shared / "theirs", 600007, 600007)
    (shared / "alices").mkdir()
    os.chown(shared / "alices", 600001, 600001)
    assert identity.squatters(r, [600001], dirs=[str(shared)]) == [f"{shared}/theirs (uid 600007)"]
    assert identity.squatters(r, [600001, 600007], dirs=[str(shared)]) == []
    identity.check_range(r, [])          # this host: no account in the default range


def test_a_plain_daemon_gets_one_unprivileged_stage() -> None:
    c = Confinement(cwd="/w", read=("/w",), write=("/w",), fds={"/w": 7}, seccomp_fd=9)
    argv = bwrap_argv(LAYOUT, c)
    assert argv[0] == "/usr/bin/bwrap" and "setpriv" not in " ".join(argv)
    assert argv[1:5] == ["--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
    assert ["--bind-fd", "7", "/w"] == argv[argv.index("--bind-fd"):argv.index("--bind-fd") + 3]
    assert argv[argv.index("--seccomp") + 1] == "9" and argv[-3:] == ["--chdir", "/w", "--"]
    nesting = bwrap_argv(LAYOUT, Confinement(cwd="/w", nesting=True))
    assert "--unshare-user" in nesting and "--disable-userns" not in nesting


def test_a_root_daemon_mounts_as_root_then_drops_for_good() -> None:
    c = Confinement(cwd="/root/state/runs/r/work", read=("/opt/cli",), write=("/root/state/runs/r/work",),
                    fds={"/root/state/runs/r/work": 7, "/opt/cli": 8}, seccomp_fd=9, user=NOBODY)
    argv = bwrap_argv(LAYOUT, c)
    split = argv.index("/usr/bin/setpriv")
    outer, rest = argv[:split], argv[split:]
    inner = rest[rest.index("/usr/bin/bwrap"):]
    # The outer stage (root) mounts by fd and keeps only what setpriv needs; it never enters the cwd.
    assert "--unshare-user" not in outer and "--seccomp" not in outer
    assert [a for i, a in enumerate(outer) if outer[i - 1] == "--cap-add"] == ["CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"]
    assert ["--ro-bind-fd", "8", "/opt/cli"] == outer[outer.index("--ro-bind-fd"):outer.index("--ro-bind-fd") + 3]
    assert outer[-3:] == ["--chdir", "/", "--"]
    # Every dir above a mount point is made passable (0755) on the sandbox's own tmpfs root.
    made = [outer[i + 1] for i, a in enumerate(outer) if a == "--dir"]
    assert made[:3] == ["/etc", "/opt", "/root"] and "/root/state/runs/r" in made and "/tmp" not in made
    assert rest[:rest.index("/usr/bin/bwrap")] == NOBODY.switch_argv("/usr/bin/setpriv")
    assert inner[1:5] == ["--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
    assert inner[inner.index("--seccomp") + 1] == "9" and inner[-3:] == ["--chdir", c.cwd, "--"]


def _in_filter(profile: str, command: str) -> str:
    """`command`'s output in a sandbox with the filter (a fresh /tmp of its own)."""
    fd = seccomp.program_fd(profile)
    try:
        os.set_inheritable(fd, True)
        argv = ["bwrap", "--unshare-user", "--dev-bind", "/", "/", "--tmpfs", "/tmp", "--seccomp", str(fd), "--",
                "sh", "-c", command]
        if os.geteuid() == 0:
            argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"] + argv
        return subprocess.run(argv, pass_fds=(fd,), capture_output=True, text=True, timeout=60, cwd="/").stdout
    finally:
        os.close(fd)


@pytest.mark.timeout(120)
def test_the_filter_refuses_namespaces_and_mounts_except_to_a_nesting_sandbox() -> None:
    probe = "unshare -r true 2>/dev/null && echo USERNS; unshare -rm mount -t tmpfs n /tmp 2>/dev/null && echo MOUNT; echo ok"
    assert _in_filter("strict", probe).split() == ["ok"]
    assert _in_filter("nesting", probe).split() == ["USERNS", "MOUNT", "ok"]
    assert len(seccomp.program("strict")) > len(seccomp.program("nesting")) > 0


def test_launch_pins_refuse_the_state_dir_and_a_swapped_cwd(tmp_path: Path) -> None:
    state, roots = tmp_path / "state", tmp_path / "roots"
    (state / "runs" / "r" / "work").mkdir(parents=True)
    (roots / "x").mkdir(parents=True)
    forbidden = [str(state)]
    work = str(state / "runs" / "r" / "work")
    p = pin(key="k", cwd=work, read=[work], write=[work], private=None, forbidden=forbidden, state_dirs=[work])
    assert set(p.fds) == {work}
    p.close()
    with pytest.raises(LaunchRefused, match="daemon's state"):        # under the state dir, not this run's
        pin(key="k", cwd=str(roots), read=[str(state / "runs")], write=[], private=None, forbidden=forbidden)
    with pytest.raises(LaunchRefused, match="daemon's state"):        # a write that contains it
        pin(key="k", cwd=str(roots), read=[], write=[str(tmp_path)], private=None, forbidden=forbidden)
    kept = pin(key="k", cwd=str(roots), read=[str(tmp_path)], write=[], private=None, forbidden=forbidden)
    assert kept.read == [] and str(tmp_path) not in kept.fds     # a read that contains it: dropped
    kept.close()
    x = str(roots / "x")
    ok = pin(key="k", cwd=x, read=[x], write=[x], private=None, forbidden=forbidden, cwd_roots=[str(roots)],
             caller_paths=[x])
    ok.close()
    os.rmdir(x)
    os.symlink(str(state / "runs"), x)                                  # swapped while the agent waited
    with pytest.raises(LaunchRefused, match="changed between"):
        pin(key="k", cwd=x, read=[x], write=[x], private=None, forbidden=forbidden, cwd_roots=[str(roots)],
            caller_paths=[x])
    os.unlink(x)
    (tmp_path / "bobs-files").mkdir()
    os.symlink(str(tmp_path / "bobs-files"), x)                         # or out of the caller's roots
    with pytest.raises(LaunchRefused, match="no longer inside the caller's cwdRoots"):
        pin(key="k", cwd=str(roots), read=[x], write=[], private=None, forbidden=forbidden,
            cwd_roots=[str(roots)], caller_paths=[x])


def test_pins_leave_no_fd_open_when_refused(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        with pytest.raises(LaunchRefused):
            pin(key="k", cwd=str(tmp_path), read=[str(tmp_path)], write=[str(tmp_path / "state")], private=None,
                forbidden=[str(tmp_path / "state")])
    assert len(os.listdir("/proc/self/fd")) == before


def test_the_replacement_git_config_keeps_the_format_and_nothing_else() -> None:
    raw = b"""[core]
\trepositoryformatversion = 1
\tfsmonitor = /evil.sh
\thooksPath = /evil
[extensions]
\tobjectFormat = sha256
\tworktreeConfig = true
[filter "evil"]
\tsmudge = /evil.sh
[include]
\tpath = /evil.inc
[diff]
\texternal = /evil.sh
"""
    assert sanitized(raw) == b"[core]\n\trepositoryformatversion = 1\n[extensions]\n\tobjectformat = sha256\n"
    assert sanitized(b"") == b"[core]\n\trepositoryformatversion = 0\n"
    assert b"evil" not in sanitized(b"[core]\nrepositoryformatversion = 0\n[extensions]\nobjectformat = evil\n")


def test_a_repository_is_found_from_its_dot_git_inside_the_roots(tmp_path: Path) -> None:
    repo = tmp_path / "roots" / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "src").mkdir()
    found = find_repository(str(repo / "src"), [str(tmp_path / "roots")])
    assert (found.top, found.common, found.rel) == (str(repo), str(repo / ".git"), "src")
    linked = tmp_path / "roots" / "linked"
    (repo / ".git" / "worktrees" / "l").mkdir(parents=True)
    (repo / ".git" / "worktrees" / "l" / "commondir").write_text("../..\n")
    linked.mkdir()
    (linked / ".git").write_text(f"gitdir: {repo / '.git' / 'worktrees' / 'l'}\n")
    assert find_repository(str(linked), [str(tmp_path / "roots")]).common == str(repo / ".git")
    with pytest.raises(WorktreeError, match="must be inside this caller's cwdRoots"):
        find_repository(str(repo / "src"), [str(repo / "src")])      # the top level is above the root
    (linked / ".git").write_text(f"gitdir: {tmp_path / 'elsewhere'}\n")
    with pytest.raises(WorktreeError, match="must be inside"):
        find_repository(str(linked), [str(tmp_path / "roots")])
    (tmp_path / "plain").mkdir()
    with pytest.raises(WorktreeError, match="not in one"):
        find_repository(str(tmp_path / "plain"), [str(tmp_path)])


async def test_a_host_that_cannot_sandbox_is_named_at_start_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from swarmbase.launch.local import LocalLauncher, SandboxUnavailable
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    (tmp_path / "procs").mkdir()
    layout = HostLayout(symlinks=(), dirs=(), bwrap=str(fake), setpriv="/usr/bin/setpriv")
    launcher = LocalLauncher(mode="bwrap", homes=tmp_path / "homes", procs=tmp_path / "procs", layout=layout)
    with pytest.raises(SandboxUnavailable, match="No permissions to create new namespace.*max_user_namespaces"):
        await launcher.self_check()
    limit = tmp_path / "max_user_namespaces"
    limit.write_text("0\n")
    monkeypatch.setattr(identity, "USERNS_LIMIT", limit)               # a host that forbids them (read only)
    with pytest.raises(SandboxUnavailable, match="max_user_namespaces is 0"):
        await launcher.self_check()


def test_the_shipped_unit_runs_as_a_dedicated_user() -> None:
    unit = (Path(__file__).resolve().parent.parent / "ops" / "swarmbase.service").read_text()
    settings = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    assert settings["User"] not in ("", "root", "0") and settings["Group"] not in ("", "root", "0")
    # bubblewrap must be able to make its namespaces under the unit.
    assert not {"RestrictNamespaces", "PrivateUsers", "DynamicUser"} & set(settings)


def test_what_the_worktree_commit_printed_is_read_back() -> None:
    from swarmbase.runs.worktrees import finished
    ok = finished("commit abc\nchanged a.txt\nchanged b.txt\nstat 2 files changed, 2 insertions(+)\nstatus 0\nremoved\n")
    assert ok == {"commit": "abc", "changed": 2, "stat": "2 files changed, 2 insertions(+)", "removed": True,
                  "error": None}
    failed = finished("fatal: unable to write new index file\nstatus 128\nremoved\n")
    assert failed["error"] == "fatal: unable to write new index file" and failed["removed"] and not failed["commit"]
    assert finished("status 0\n")["removed"] is False          # kept, or the unregistering failed


def test_a_script_cli_gets_its_venv_and_the_base_install_it_links_to(tmp_path: Path) -> None:
    # A CLI whose shebang names a venv's python: exec inside the sandbox needs the venv's
    # link as well as the install it resolves to (the clean-checkout suite hit this).
    base = tmp_path / "base"
    (base / "bin").mkdir(parents=True)
    (base / "bin" / "python3").write_text("")
    venv = tmp_path / "proj" / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(base / "bin" / "python3")
    cli = tmp_path / "tools" / "claude"
    cli.parent.mkdir()
    cli.write_text(f"#!{venv / 'bin' / 'python'}\nprint(1)\n")
    paths = interpreter_paths(str(cli), "/usr/bin")
    assert str(cli.parent) in paths and str(venv) in paths and str(base) in paths


SETID_PROBE = """
import ctypes, errno, os, socket, stat
os.chdir(os.environ["D"])
libc = ctypes.CDLL(None, use_errno=True)
def call(*args):
    if libc.syscall(*args) < 0:
        raise OSError(ctypes.get_errno(), "")
def tried(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
open("f", "w").close()
print(tried(lambda: os.chmod("f", 0o4755)), tried(lambda: os.chmod("f", 0o2700)), tried(lambda: os.chmod("f", 0o755)),
      tried(lambda: call(452, -100, b"f", 0o4755, 0)), tried(lambda: call(452, -100, b"f", 0o644, 0)),
      tried(lambda: os.close(os.open("g", os.O_CREAT | os.O_WRONLY, 0o6755))),
      tried(lambda: os.close(os.open("h", os.O_CREAT | os.O_WRONLY, 0o644))),
      tried(lambda: os.close(os.open(".", os.O_TMPFILE | os.O_WRONLY, 0o4700))),
      tried(lambda: call(437, -100, b"f", ctypes.c_char_p(bytes(24)), 24)),
      tried(lambda: socket.socket(40, socket.SOCK_STREAM).close()),
      tried(lambda: socket.socket(16, socket.SOCK_RAW, 12).close()), oct(os.stat("f").st_mode & 0o7777))
"""


@pytest.mark.timeout(120)
def test_the_filter_refuses_setid_modes_and_vsock_in_both_profiles() -> None:
    """chmod/fchmodat2 with S_ISUID or S_ISGID, a creating open with them (O_CREAT and
    O_TMPFILE), openat2 (ENOSYS: its mode is out of the filter's reach), vsock; and, in the
    nesting profile only, NETLINK_NETFILTER (a nested namespace could hold capabilities)."""
    assert os.uname().machine != "x86_64" or seccomp.UNIFIED_NUMBERS == {"fchmodat2": 452}
    probe = f"D=/tmp python3 -c '{SETID_PROBE}'"
    strict = _in_filter("strict", probe).split()
    assert strict == ["EPERM", "EPERM", "ok", "EPERM", "ok", "EPERM", "ok", "EPERM", "ENOSYS", "EPERM", "ok", "0o644"]
    assert _in_filter("nesting", probe).split() == [*strict[:10], "EPERM", "0o644"]
