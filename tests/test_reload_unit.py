"""reload.plan (pure) and the swap's completeness: every class that keeps the Config is
one swap knows; LIVE names only real keys; a restart-only change merged back must still
validate."""

from __future__ import annotations

import json
import re
from pathlib import Path

import attrs
import pytest

from swarmbase import config, live_reload, reload
from swarmbase.runs.retention_rules import Retention

from .conftest import write_config

PACKAGE = Path(config.__file__).resolve().parent


def load(tmp_path: Path, **extra: object) -> config.Config:
    path, _ = write_config(tmp_path, callers=["alice", "bob"], sandbox="none", **extra)
    return config.load(path)


def test_every_holder_of_the_config_is_swapped() -> None:
    """A new class keeping `self.cfg` would keep the old Config after a reload: name it in
    live_reload.HOLDERS and give it the new one in swap()."""
    holders = set()
    for src in [*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "dashboard").rglob("*.py")]:
        cls = None
        for line in src.read_text().splitlines():
            if m := re.match(r"class (\w+)", line):
                cls = m.group(1)
            if re.search(r"self\.cfg = ", line) and cls is not None:
                holders.add(cls)
    holders.add("Services")          # an attrs field, not an assignment
    holders.add("RunEnv")            # its ConfigSlot, read by everything that reads env.cfg
    assert holders == set(live_reload.HOLDERS)


def test_live_keys_are_config_keys() -> None:
    assert reload.LIVE <= set(reload.keys())


def test_plan_names_what_changed(tmp_path: Path) -> None:
    old = load(tmp_path)
    carol = attrs.evolve(old.callers[0], name="carol", tokenSha256="c" * 64)
    bob = attrs.evolve(old.callers[1], tokenSha256="b" * 64)
    alice = attrs.evolve(old.callers[0], runUsdMax=7.0)
    new = attrs.evolve(old, callers=[alice, bob, carol], agentTimeoutMs=5000, port=9999, maxConcurrentAgents=3)
    p = reload.plan(old, new)
    assert (p.added, p.removed, p.rotated, p.changed) == (("carol",), (), ("bob",), ("alice",))
    assert p.applied == ("agentTimeoutMs",) and p.needs_restart == ("port", "maxConcurrentAgents")
    assert p.config.port == old.port and p.config.maxConcurrentAgents == old.maxConcurrentAgents
    assert p.config.agentTimeoutMs == 5000 and p.config.caller("alice").runUsdMax == 7.0
    # A session is judged by the token it connected with, against the new config.
    assert reload.session_verdict(p.config, "bob", old.callers[1].tokenSha256) == (
        reload.CLOSE_TOKEN_ROTATED, "the caller's token was rotated; reconnect with the new token")
    assert reload.session_verdict(p.config, "bob", "b" * 64) is p.config.caller("bob")
    assert reload.session_verdict(p.config, "alice", old.callers[0].tokenSha256) is p.config.caller("alice")
    gone = reload.plan(new, attrs.evolve(new, callers=[alice]))
    assert gone.removed == ("bob", "carol")
    assert reload.session_verdict(gone.config, "carol", "c" * 64)[0] == reload.CLOSE_CALLER_REMOVED
    assert reload.plan(old, old).summary() == "config reloaded: nothing changed"


def test_a_merge_that_no_longer_validates_is_refused(tmp_path: Path) -> None:
    """The new file adds the codex engine and a caller that uses it; engines need a
    restart, so the merged config has no codex: refused, not half-applied."""
    old = config.load(write_config(tmp_path / "a", callers=["alice"])[0])
    codex = tmp_path / "codex"
    codex.write_text("#!/bin/sh\n")
    codex.chmod(0o755)
    path, _ = write_config(tmp_path / "a", callers=["alice"],
                           engines={"codex": {"bin": str(codex), "baseUrl": "http://127.0.0.1:9/v1",
                                              "defaultModel": "gpt-x"}},
                           caller_extra={"engines": ["codex"]})
    new = config.load(path)
    with pytest.raises(config.ConfigError) as e:
        reload.plan(old, new)
    assert str(e.value) == ("callers[0].engines[0]: engine 'codex' is not configured under engines "
                            "(with engines kept at the running value until a restart)")


def test_status_file_round_trip(tmp_path: Path) -> None:
    from swarmbase.reload_cli import read_status
    live_reload.write_status(tmp_path, 12.5, False, "reload refused: x")
    st = read_status(tmp_path)
    assert st is not None and (st["readAt"], st["ok"], st["message"]) == (12.5, False, "reload refused: x")
    (tmp_path / live_reload.STATUS_FILE).write_text("{torn")
    assert read_status(tmp_path) is None
    assert json.loads(json.dumps(st))


async def test_hangups_coalesce_while_a_reload_runs_and_restore_the_handler() -> None:
    import os
    import signal

    import trio
    before = signal.getsignal(signal.SIGHUP)
    hangups = live_reload.Hangups()
    started, release = trio.Event(), trio.Event()
    calls = 0

    async def reload_once() -> None:
        nonlocal calls
        calls += 1
        started.set()
        await release.wait()
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as n:
                n.start_soon(hangups.serve, reload_once)
                await trio.lowlevel.checkpoint()
                os.kill(os.getpid(), signal.SIGHUP)
                await started.wait()
                for _ in range(3):                 # three more while the first runs: one more reload
                    os.kill(os.getpid(), signal.SIGHUP)
                while hangups.pending < 3:
                    await trio.sleep(0.01)
                started = trio.Event()
                release.set()
                await started.wait()
                assert calls == 2
                await trio.sleep(0.05)
                assert calls == 2 and hangups.pending == 0
                n.cancel_scope.cancel()
    finally:
        hangups.restore()
    assert signal.getsignal(signal.SIGHUP) == before


async def test_a_fault_in_a_reload_is_reported_and_does_not_escape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    import types

    from swarmbase.reload_cli import read_status
    cfg = load(tmp_path)

    def broken(running: config.Config, loaded: config.Config) -> reload.Plan:
        raise RuntimeError("a bug")
    monkeypatch.setattr(reload, "plan", broken)
    assert await live_reload.reload_once(types.SimpleNamespace(cfg=cfg)) is None
    st = read_status(cfg.state_dir)
    assert st is not None and (st["ok"], st["message"]) == (
        False, "reload failed: internal error (RuntimeError); the daemon log has the details")


def test_the_swap_reaches_the_run_env_the_agent_service_and_both_think_paths(tmp_path: Path) -> None:
    # The Supervisor, boot, flush and live runs read env.cfg; the engines keep their own
    # (behind the think router: the CLI engine and the in-daemon one).
    from swarmbase.daemon import build_services
    from swarmbase.engines.think_route import ThinkRouter
    path, _ = write_config(tmp_path, callers=["alice"], sandbox="none", engines={"claude": {"bin": "/bin/true"}})
    old = config.load(path)
    services = build_services(old)
    new = attrs.evolve(old, maxAgentsPerRun=old.maxAgentsPerRun - 1)
    live_reload.swap(services, new)
    sup = services.supervisor
    assert services.cfg is new and sup.env.cfg is new and sup.agents.cfg is new   # type: ignore[attr-defined]
    router = sup.agents.engines["claude"]                                          # type: ignore[attr-defined]
    assert isinstance(router, ThinkRouter)
    assert router.cli.cfg is new and router.in_daemon.cfg is new                   # type: ignore[attr-defined]


def test_the_readme_lists_exactly_the_restart_only_keys() -> None:
    """Issue 32.3: the README's list of settings that need a restart omitted `retention`
    (then restart-only). Each key it names must be one reload keeps, and each kept key named."""
    readme = (PACKAGE.parent / "README.md").read_text()
    m = re.search(r"Settings that something holds from the start — (.*?) — keep their running value", readme, re.S)
    assert m, "the README's restart-only paragraph moved: update this test"
    named = {name.split(".")[0] for name in re.findall(r"`([^`]+)`", m.group(1))}   # dashboard.adminLogins
    assert named == set(reload.keys()) - reload.LIVE


def test_a_retention_change_is_applied_and_said(tmp_path: Path) -> None:
    old = load(tmp_path)
    on = attrs.evolve(old, retention=Retention(maxRuns=5))
    assert reload.plan(old, on).summary() == "config reloaded: applied retention (a pass runs now)"
    assert reload.plan(on, on).summary() == "config reloaded: nothing changed"
    off = reload.plan(on, old)
    assert off.summary() == "config reloaded: applied retention (off: runs are kept)" and off.config.retention is None
