"""Issue 31 item 1, as an attacker would try it, against the real daemon process (as root
in CI) and the real Claude Code CLI whose Bash the fake API scripts: two callers' write
agents running at once run as two different uids of the daemon's range (neither root nor
`nobody`), the ones the daemon allocated and persisted for them; as one caller's uid — an
agent that got out, or a setuid file it tried to plant — nothing reads the other's agent's
/proc/<pid>/environ (its API key) or writes the other's root; and neither does any other
local account (`nobody`, the old shared sandbox user). The uids stay the same after a
restart, so the roots chowned to them keep working."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from swarmbase import identity
from swarmbase.client import connect

from .clidaemon import cli_daemon
from .conftest import CLAUDE, descendants, give_to_sandbox, write_config
from .fakes.anthropic_api import FakeAnthropic

KEYS = {"alice": "sk-ant-alice-" + secrets.token_hex(16), "bob": "sk-ant-bob-" + secrets.token_hex(16)}
NOBODY = 65534


def as_uid(uid: int, command: str, dirs: dict[str, int]) -> subprocess.CompletedProcess[str]:
    """`command` on the host as `uid`, with no groups and no capability (as any local account).
    The roots are reached through inherited fds (/proc/self/fd/N): the test's temp dir has
    0700 parents, and an account the operator set up would reach the roots by their path."""
    for name, fd in dirs.items():
        command = command.replace(f"@{name}@", f"/proc/self/fd/{fd}")
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
                           "--", "sh", "-c", command], capture_output=True, text=True, timeout=30, cwd="/",
                          pass_fds=tuple(dirs.values()))


def agent_of(pids: list[int], name: str) -> int:
    """The agent process of caller `name` (the CLI, not the bubblewrap and setpriv that start
    it): the one whose stdin, the prompt file, plants `cat-<name>`. (Its environment holds the
    key door's bearer, not the caller's key: that is test_claude_engine's.)"""
    for pid in pids:
        try:
            program = os.path.basename(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0])
            if program in (b"bwrap", b"setpriv"):
                continue
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if not any(e.startswith(b"ANTHROPIC_API_KEY=") for e in environ):
                continue
            if f"cat-{name}".encode() in Path(f"/proc/{pid}/fd/0").read_bytes():
                return pid
        except OSError:
            continue
    raise AssertionError(f"no agent process of {name}")


def host_uid(pid: int) -> int:
    line = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("Uid:"))
    uids = {int(u) for u in line.split()[1:]}
    assert len(uids) == 1, line
    return uids.pop()


@pytest.mark.timeout(300)
async def test_two_callers_agents_run_as_two_uids_that_cannot_reach_each_other(
        tmp_path: Path, nursery: trio.Nursery, claude_bin: str) -> None:
    if os.geteuid() != 0:
        pytest.fail("per-caller uids need a root daemon (CI runs the suite as root)")
    api = await nursery.start(FakeAnthropic().serve)
    state = tmp_path / "state"
    state.mkdir()
    roots = {}
    for name in KEYS:
        (state / f"{name}.key").write_text(KEYS[name])
        (state / f"{name}.key").chmod(0o600)
        roots[name] = tmp_path / f"{name}-root"
        roots[name].mkdir()
        (roots[name] / "notes.txt").write_text(f"{name}'s notes\n")
        give_to_sandbox(roots[name], state, name)       # as the README says: chown the root to the caller's uid
    path, tokens = write_config(state, engines={"claude": {"bin": str(CLAUDE), "baseUrl": api.url}})
    raw = json.loads(path.read_text())
    for c in raw["callers"]:
        c.update(apiKeyFile=str(state / f"{c['name']}.key"), maxProfile="write", cwdRoots=[str(roots[c["name"]])])
    path.write_text(json.dumps(raw))
    held = json.loads((state / identity.ALLOCATIONS).read_text())["callers"]
    uids = {name: held[name] for name in KEYS}
    # Each agent plants what it can: a copy of cat with the setuid bit (refused) in its root.
    def plant(name: str) -> str:
        return json.dumps(f"[[bashhang:cp /bin/cat ./cat-{name}; chmod u+s ./cat-{name}; id -u; "
                          f"echo {name.upper()}-$((40+2))]]")
    async with cli_daemon(path) as d:
        assert f"caller alice: children run as uid {uids['alice']}" in d.stderr.decode()
        with trio.fail_after(200):
            async with connect(d.ws, tokens["alice"]) as ha, connect(d.ws, tokens["bob"]) as hb:
                await ha.handshake()
                await hb.handshake()
                for name, h in (("alice", ha), ("bob", hb)):
                    script = f"return await agent({plant(name)}, {{profile: 'write', cwd: {json.dumps(str(roots[name]))}}})"
                    await h.tool("run", {"script": script})
                # Both planted, and both CLIs wait on their next model turn: running at once.
                def both_planted() -> bool:
                    return all(any(f"{n.upper()}-42" in json.dumps(r["body"].get("messages", [])[1:])
                                   for r in api.requests) for n in KEYS)
                while not both_planted():  # noqa: ASYNC110 (the fake's request log has no event to wait on)
                    await trio.sleep(0.05)
                pids = descendants(d.proc.pid)
                agents = {name: agent_of(pids, name) for name in KEYS}
                running = {name: host_uid(pid) for name, pid in agents.items()}
                attempts = {}
                fds = {name: os.open(roots[name], os.O_RDONLY | os.O_DIRECTORY) for name in KEYS}
                try:
                    for me, other in (("alice", "bob"), ("bob", "alice")):
                        theirs = agents[other]
                        attempts[me] = {
                            "environ": as_uid(uids[me], f"cat /proc/{theirs}/environ", fds),
                            "via-planted": as_uid(uids[me], f"@{me}@/cat-{me} /proc/{theirs}/environ", fds),
                            "write": as_uid(uids[me], f"echo x > @{other}@/from-{me}", fds),
                            "own-root": as_uid(uids[me], f"echo x > @{me}@/mine && cat @{me}@/notes.txt", fds),
                        }
                    outsider = {name: (as_uid(NOBODY, f"cat /proc/{agents[name]}/environ", fds),
                                       as_uid(NOBODY, f"echo x > @{name}@/from-nobody", fds)) for name in KEYS}
                finally:
                    for fd in fds.values():
                        os.close(fd)
                planted_modes = {name: (roots[name] / f"cat-{name}").stat().st_mode for name in KEYS}
    assert running == uids, (running, uids)                                  # the allocated uids, one each
    assert uids["alice"] != uids["bob"] and not {0, NOBODY} & set(uids.values())
    assert all(identity.UidRange.parse(identity.DEFAULT_UIDS).first < u for u in uids.values())
    for me, tried in attempts.items():
        for what in ("environ", "via-planted", "write"):
            assert tried[what].returncode != 0, (me, what, tried[what])
            assert KEYS["bob" if me == "alice" else "alice"] not in tried[what].stdout
        # Its own root stays its own (so the refusals above are not a path it cannot reach).
        assert tried["own-root"].returncode == 0 and f"{me}'s notes" in tried["own-root"].stdout, (me, tried)
        assert "Permission denied" in tried["write"].stderr and "Permission denied" in tried["environ"].stderr
    for name, (environ, write) in outsider.items():
        assert environ.returncode != 0 and KEYS[name] not in environ.stdout and write.returncode != 0, name
    for name, mode in planted_modes.items():
        assert not mode & 0o6000, (name, oct(mode))                             # no setuid file was made
    assert not any((roots[n] / f"from-{m}").exists() for n in KEYS for m in (*KEYS, "nobody"))
    # A restart keeps each caller's uid (the roots chowned to it keep working).
    async with cli_daemon(path) as d:
        text = d.stderr.decode()
    for name in KEYS:
        assert f"caller {name}: children run as uid {uids[name]}" in text, text


@pytest.mark.timeout(60)
async def test_a_range_with_accounts_of_the_machine_stops_the_daemon(tmp_path: Path) -> None:
    """sandboxUids over an account of /etc/passwd (here nobody's uid): the real daemon
    stops at start with one line naming it, and never runs a child as that uid."""
    if os.geteuid() != 0:
        pytest.fail("per-caller uids need a root daemon (CI runs the suite as root)")
    path, _ = write_config(tmp_path / "state", callers=["alice"], sandboxUids=f"{NOBODY - 10}-{NOBODY + 10}")
    env = dict(os.environ, SWARMBASE_CONFIG=str(path))
    with trio.fail_after(50):
        done = await trio.run_process([sys.executable, "-m", "swarmbase"], env=env, capture_stderr=True, check=False)
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert "cannot start" in err and f"overlaps accounts of this machine: user nobody ({NOBODY})" in err, err
    assert "Traceback" not in err and "listening" not in err
