"""The real `python -m swarmbase` process: first start, bad config, add-caller, SIGTERM drain."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from swarmbase import config, defaults
from swarmbase.client import connect

from .conftest import start_cli_daemon, write_config


def child_pids(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def cli_env(cfg_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    # As an operator's shell or systemd runs it: stderr buffered, so a write to a closed
    # pipe fails the daemon's exit (status 120) whether or not the suite's shell set this.
    env.pop("PYTHONUNBUFFERED", None)
    env["SWARMBASE_CONFIG"] = str(cfg_path)
    env["PATH"] = "/usr/bin:/bin"           # no claude on PATH for these tests
    return env


def test_write_default_config(tmp_path: Path) -> None:
    path = tmp_path / "state" / "config.json"
    msg = defaults.write_default(path)
    cfg = config.load(path)
    assert cfg.port == 7360
    [local] = cfg.callers
    token_file = tmp_path / "state" / "mcpl-local.token"
    assert oct(token_file.stat().st_mode & 0o777) == "0o600"
    token = token_file.read_text().strip()
    assert hashlib.sha256(token.encode()).hexdigest() == local.tokenSha256
    assert token not in path.read_text()
    assert str(token_file) in msg and "ws://127.0.0.1:7360/mcpl" in msg


def test_first_start_makes_the_key_file_and_check_config_names_it_until_filled(tmp_path: Path) -> None:
    """Issue 32.6: the first agent of the README's first start failed with "caller 'local'
    has no apiKeyFile". The first start makes an empty 0600 key file for `local` and prints
    the one command that fills it; check-config names it (exit 1) until it holds a key."""
    path = tmp_path / "state" / "config.json"
    msg = defaults.write_default(path)
    key_file = tmp_path / "state" / "local.key"
    [local] = config.load(path).callers
    assert local.apiKeyFile == str(key_file)
    assert key_file.read_bytes() == b"" and key_file.stat().st_mode & 0o777 == 0o600
    [line] = [x for x in msg.splitlines() if "API key" in x]
    command = f"printf '%s' \"$ANTHROPIC_API_KEY\" > {shlex.quote(str(key_file))}"
    assert line.endswith(": " + command) and str(key_file) in line, line

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "swarmbase", "check-config"], env=cli_env(path),
                              capture_output=True, text=True, timeout=30)
    before = check()
    assert before.returncode == 1, before
    assert f"swarmbase: caller local: the key file {key_file} is empty" in before.stderr
    assert command in before.stderr and "its agents fail until then" in before.stderr
    # The printed command, run as printed, fills the file and keeps it 0600.
    subprocess.run(["sh", "-c", command], env={"ANTHROPIC_API_KEY": "sk-canary-32-6"}, check=True, timeout=10)
    assert key_file.read_text() == "sk-canary-32-6" and key_file.stat().st_mode & 0o777 == 0o600
    after = check()
    assert after.returncode == 0 and "empty" not in after.stderr and "sk-canary" not in after.stderr, after
    key_file.unlink()
    gone = check()
    assert gone.returncode == 1 and f"the key file {key_file} does not exist" in gone.stderr, gone


def test_first_start_writes_config_and_prints_where(tmp_path: Path) -> None:
    # The embedded default listens on 7360: wait while something else (another worker's
    # test, another program on the machine) holds it, and name the holder if it never goes.
    deadline = time.monotonic() + 120
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", 7360)) != 0:
                break
        if time.monotonic() > deadline:
            held = subprocess.run(["ss", "-ltnp", "sport = :7360"], capture_output=True, text=True).stdout
            pytest.fail(f"port 7360 is taken; the embedded default listens there:\n{held}")
        time.sleep(0.5)
    path = tmp_path / "home" / "config.json"
    proc = subprocess.Popen([sys.executable, "-m", "swarmbase"], env=cli_env(path),
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    try:
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if "listening on" in line:
                break
        text = "".join(lines)
        assert f"token is in {tmp_path / 'home' / 'mcpl-local.token'}" in text
        assert f"printf '%s' \"$ANTHROPIC_API_KEY\" > {shlex.quote(str(tmp_path / 'home' / 'local.key'))}" in text
        assert "ws://127.0.0.1:7360/mcpl" in text
        assert path.exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        # Read to the end (issue 32.10): the daemon logs its shutdown, and with the pipe
        # closed that write fails Python's flush of stderr at exit: status 120, not 0.
        rest = proc.communicate(timeout=20)[1]
    assert proc.returncode == 0, rest
    assert "shutting down" in rest


def test_bad_config_stops_start_up_with_one_message(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"port": 7360, "callers": [{"name": "x", "tokenSha256": "' + "a" * 64 + '", "runUsdMax": "lots"}]}')
    for argv in (["-m", "swarmbase"], ["-m", "swarmbase", "check-config"]):
        out = subprocess.run([sys.executable, *argv], env=cli_env(path), capture_output=True, text=True, timeout=30)
        assert out.returncode == 2
        assert out.stderr.strip().splitlines()[-1] == (
            f"swarmbase: bad config: {path}: callers[0].runUsdMax: must be a number, got a string")


def test_add_caller(tmp_path: Path) -> None:
    path, _ = write_config(tmp_path / "s", callers=["alice"])
    out = subprocess.run([sys.executable, "-m", "swarmbase", "add-caller", "carol"], env=cli_env(path),
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "no daemon is running; it serves the new caller when it starts" in out.stderr
    token_file = tmp_path / "s" / "mcpl-carol.token"
    key_file = tmp_path / "s" / "carol.key"
    assert token_file.stat().st_mode & 0o777 == 0o600 and key_file.stat().st_mode & 0o777 == 0o600
    cfg = config.load(path)
    carol = cfg.caller("carol")
    assert carol is not None and carol.apiKeyFile == str(key_file)
    assert carol.tokenSha256 == hashlib.sha256(token_file.read_text().strip().encode()).hexdigest()
    again = subprocess.run([sys.executable, "-m", "swarmbase", "add-caller", "carol"], env=cli_env(path),
                           capture_output=True, text=True, timeout=30)
    assert again.returncode == 2 and "already exists" in again.stderr


async def test_sigterm_drains_interrupts_runs_and_kills_runner(tmp_path: Path) -> None:
    path, tokens = write_config(tmp_path / "s", callers=["alice"], scriptSliceMs=600_000)
    with trio.fail_after(60):
        proc, ws = await start_cli_daemon(path, cli_env(path))
    try:
        with trio.fail_after(60):
            async with connect(ws, tokens["alice"]) as h:
                await h.handshake()
                run_id = (await h.tool("run", {"script": "let i = 0; while (true) { i++; }"}))["structuredContent"]["runId"]
                while not (runners := [p for p in child_pids(proc.pid) if b"runner.mjs" in
                                       Path(f"/proc/{p}/cmdline").read_bytes()]):
                    await trio.sleep(0.05)
                proc.send_signal(signal.SIGTERM)
                await h.closed_event.wait()
                assert h.closed.reason.code == 1001
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
    assert not any(alive(p) for p in runners)
    run_json = json.loads(next((tmp_path / "s" / "runs").glob(f"*-{run_id}/run.json")).read_text())
    assert run_json["status"] == "interrupted"
    # The notice was queued durably (an add line, then its amend carrying the end-record
    # hash); the still-connected host may have taken it before the drain (then an ack line
    # follows).
    lines = [json.loads(line) for line in (tmp_path / "s" / "outbox.jsonl").read_text().splitlines()]
    adds = [e["notice"] for e in lines if e["op"] == "add"]
    assert [n["eventId"] for n in adds] == [f"{run_id}:end"] * 2
    assert adds[0]["tags"][-1] == "swarmbase:interrupted"
    assert adds[1]["origin"]["endHash"] == run_json["end"]["hash"]


async def test_minimal_host_client_waits_for_the_end_notice(tmp_path: Path) -> None:
    with socket.socket() as s:                       # a free port the client can find in the config
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path, _ = write_config(tmp_path / "s", callers=["alice"], port=port)
    with trio.fail_after(60):
        proc, _ws = await start_cli_daemon(path, cli_env(path))
    try:
        args = [sys.executable, "-m", "swarmbase.client", "alice", "run",
                json.dumps({"script": "phase('p');\nreturn 6 * 7", "label": "from the client"}), "--wait"]
        out = await trio.run_process(args, env=cli_env(path), capture_stdout=True, capture_stderr=True, check=False)
        assert out.returncode == 0, out.stderr.decode()
        text = out.stdout.decode()
        run_id = json.loads(text[: text.index("}") + 1])["runId"]
        assert f'"eventId": "{run_id}:end"' in text and "swarmbase:completed" in text and "42" in text
        bad = await trio.run_process([sys.executable, "-m", "swarmbase.client", "alice", "status", "{not json"],
                                     env=cli_env(path), capture_stdout=True, capture_stderr=True, check=False)
        assert bad.returncode == 2 and b"not valid JSON" in bad.stderr
        refused = await trio.run_process([sys.executable, "-m", "swarmbase.client", "alice", "status",
                                          json.dumps({"runId": "run_000000000000"})],
                                         env=cli_env(path), capture_stdout=True, capture_stderr=True, check=False)
        assert refused.returncode == 1 and b"no run" in refused.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        await proc.wait()


def test_the_commands_that_do_not_serve_do_not_import_the_daemon() -> None:
    """`swarmbase reload` (and add-caller, audit, usage) load only what they use: importing
    the daemon (quart, the supervisor) cost ~0.6 CPU-s, so on a loaded machine a reload
    command took 2-4 s while the daemon's own reload took 25 ms (bench/reload.py --via-cli)."""
    probe = "import sys, swarmbase.cli; print(sorted(m for m in ('swarmbase.daemon', 'quart') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout
