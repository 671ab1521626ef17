"""Issue 31 item 2, as an attacker would try it, against the real daemon process (as root
in CI) with the real Claude Code and Codex CLIs whose shells the fake APIs script: a write
agent cannot make a setuid or setgid file (chmod, a creating open, mknod — the planted
setuid binary another local account would run to become the agent's uid), a setuid file
put in its root from outside grants nothing (the root is mounted nosuid), and it gets no
vsock socket; codex, which builds a user namespace of its own, gets no AF_PACKET or
NETLINK_NETFILTER socket in it either."""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
from pathlib import Path

import pytest
import trio

from .clidaemon import cli_daemon
from .conftest import CLAUDE, CODEX, give_to_sandbox, write_config
from .fakes.anthropic_api import FakeAnthropic
from .fakes.responses_api import FakeResponses
from .clidaemon import run_script

KEY = "sk-ant-setid-" + secrets.token_hex(12)

# Every way a shell or a program would set the bits, then the sockets, then what a planted
# setuid binary yields and how the root is mounted. Python is the host's (under /usr).
SOCKETS = """
import errno, os, socket, stat
def tried(name, f):
    try:
        f()
        print(name, "ALLOWED")
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, e.errno))
tried("open-creat-suid", lambda: os.close(os.open("made-suid", os.O_CREAT | os.O_WRONLY, 0o4755)))
tried("mknod-sgid", lambda: os.mknod("made-sgid", stat.S_IFREG | 0o2755))
tried("fchmod-suid", lambda: os.fchmod(os.open("plain", os.O_RDONLY), 0o4755))
tried("vsock", lambda: socket.socket(40, socket.SOCK_STREAM).close())
tried("packet", lambda: socket.socket(17, socket.SOCK_RAW, 0).close())
tried("netlink-netfilter", lambda: socket.socket(16, socket.SOCK_RAW, 12).close())
tried("netlink-route", lambda: socket.socket(16, socket.SOCK_RAW, 0).close())
"""
PROBE = ("cd \"$1\"; touch plain; chmod u+s plain; echo \"chmod-u+s rc=$?\"; chmod g+s plain; echo \"chmod-g+s rc=$?\"; "
         "chmod 0755 plain; echo \"chmod-plain rc=$?\"; "
         "python3 sockets.py; stat -c 'MODE %a %n' plain made-suid made-sgid 2>/dev/null; "
         "echo \"PLANTED $(./planted-id -u) SELF $(id -u)\"; "
         "awk -v d=\"$PWD\" '$5 == d {print \"MOUNT\", $6}' /proc/self/mountinfo; echo PROBED")


def command(cwd: Path) -> str:
    """One shell line (base64, so neither CLI's own rules nor JSON quoting see the probe)."""
    sockets = base64.b64encode(SOCKETS.encode()).decode()
    probe = base64.b64encode(PROBE.encode()).decode()
    # Written in the cwd: codex's own sandbox makes /tmp read-only.
    return f"cd {cwd} && echo {sockets} | base64 -d > sockets.py; echo {probe} | base64 -d > p.sh; bash p.sh {cwd}"


def results(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.replace("tool said: ", "\n").splitlines():
        words = line.split()
        if len(words) == 2 and words[0] in ("open-creat-suid", "mknod-sgid", "fchmod-suid", "vsock", "packet",
                                              "netlink-netfilter", "netlink-route"):
            out[words[0]] = words[1]
        elif len(words) == 2 and words[0].startswith("chmod-"):
            out[words[0]] = words[1]
        elif words[:1] == ["MODE"] and len(words) == 3:
            out["mode " + words[2]] = words[1]
        elif words[:1] == ["PLANTED"]:
            out["PLANTED"] = " ".join(words[1:])
        elif words[:1] == ["MOUNT"] and len(words) == 2:     # codex's own sandbox mounts the cwd again
            out["MOUNT"] = (out["MOUNT"] + " " if "MOUNT" in out else "") + words[1]
    return out


@pytest.mark.timeout(300)
async def test_a_write_agent_makes_no_setid_file_and_a_planted_one_grants_nothing(
        tmp_path: Path, nursery: trio.Nursery, claude_bin: str, codex_bin: str) -> None:
    assert shutil.which("python3", path="/usr/bin"), "the probe uses the host's python3"
    anthropic = await nursery.start(FakeAnthropic().serve)
    responses = await nursery.start(FakeResponses().serve)
    state = tmp_path / "state"
    state.mkdir()
    (state / "alice.key").write_text(KEY)
    (state / "alice.key").chmod(0o600)
    roots = tmp_path / "roots"
    for engine in ("claude", "codex"):
        (roots / engine).mkdir(parents=True)
        # Planted from outside: a setuid copy of id(1), owned by the daemon's user (root in CI).
        shutil.copy("/usr/bin/id", roots / engine / "planted-id")
        (roots / engine / "planted-id").chmod(0o4755)
    give_to_sandbox(roots, state)
    for engine in ("claude", "codex"):
        os.chown(roots / engine / "planted-id", os.geteuid(), os.getegid())
        (roots / engine / "planted-id").chmod(0o4755)      # chown clears the bit
    path, tokens = write_config(
        state, callers=["alice"],
        engines={"claude": {"bin": str(CLAUDE), "baseUrl": anthropic.url},
                 "codex": {"bin": str(CODEX), "baseUrl": responses.url, "maxTokensDefault": 200_000}},
        caller_extra={"apiKeyFile": str(state / "alice.key"), "maxProfile": "write", "cwdRoots": [str(roots)],
                      "defaultModels": {"codex": "gpt-5.5"}})
    claude_cwd, codex_cwd = roots / "claude", roots / "codex"
    script = (f"return await parallel(["
              f"() => agent({json.dumps('[[bash:' + command(claude_cwd) + ']]')}, "
              f"{{profile: 'write', cwd: {json.dumps(str(claude_cwd))}}}),"
              f"() => agent({json.dumps('[[shell:' + command(codex_cwd) + ']]')}, "
              f"{{engine: 'codex', profile: 'write', cwd: {json.dumps(str(codex_cwd))}}})])")
    async with cli_daemon(path) as d:
        _, _, out = await run_script(d.ws, tokens["alice"], script, timeout=250, budgetUsd=10)
    claude_out, codex_out = out
    for engine, text in (("claude", claude_out), ("codex", codex_out)):
        assert "PROBED" in text, (engine, text)
        got = results(text)
        assert got.get("chmod-u+s") == "rc=1" and got.get("chmod-g+s") == "rc=1", (engine, got, text)
        assert got["chmod-plain"] == "rc=0", (engine, got)                 # a plain chmod still works
        for call in ("open-creat-suid", "mknod-sgid", "fchmod-suid", "vsock"):
            assert got[call] == "EPERM", (engine, call, got)
        # Nothing the agent left carries a setid bit (a creating open may not have made it at all).
        assert got["mode plain"] == "755", (engine, got)
        for f in (roots / engine).iterdir():
            if f.name != "planted-id":
                assert not f.stat().st_mode & 0o6000, (engine, f, oct(f.stat().st_mode))
        # The planted setuid binary runs as the agent, on a nosuid mount.
        planted, self_uid = got["PLANTED"].split(" SELF ")
        assert planted == self_uid and planted != "0", (engine, got)
        assert all("nosuid" in m.split(",") for m in got["MOUNT"].split()), (engine, got)
        assert got["netlink-route"] == "ALLOWED", (engine, got)            # other sockets work
    # codex's shell runs in the CLI's own user namespace, where it could hold capabilities.
    codex_got = results(codex_out)
    assert codex_got["packet"] == "EPERM" and codex_got["netlink-netfilter"] == "EPERM", codex_got
    assert results(claude_out)["packet"] == "EPERM", claude_out            # no capability at all
