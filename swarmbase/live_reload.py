"""Reloading the running daemon's config: on SIGHUP (a terminal closing, `systemctl
reload`, `swarmbase reload`, `swarmbase add-caller`) the daemon reads its config file
again, and either swaps in the new Config or refuses it and keeps the running one.

Order of a reload, and why:
1. Read and validate the file in a worker thread (it resolves CLI paths on PATH); then
   reload.plan merges it with the settings that need a restart. Any error refuses the
   whole reload, with the usual one-line ConfigError, and nothing has changed yet.
2. Swap: every piece that holds the Config gets the new object here, in one function
   (swap), synchronously, so no run start or agent start sees a mix of old and new.
   The holders are listed in HOLDERS; tests/test_reload_unit.py fails when a class in the
   package keeps a `self.cfg` that is not listed there.
3. New callers' key and token values join the redaction set (rotated-out tokens stay in
   it: a record must never show one).
4. Open sessions: a removed caller's is closed with 4003, a rotated token's with 4004 (at
   once: the old token is worthless from the swap on, since new connections match the new
   Config), each judged by the token it connected with; a connection matched before the
   swap is judged again when it registers (Session.serve). Every other session gets its
   new Caller, so its next run uses the new limits.
5. The outcome is logged (one line) and written to <state>/reload-status.json, which is
   how `swarmbase reload` learns it (reload_cli.py).

Running runs keep the Caller they started with (its limits, key file, budget rules): a
removed caller's runs go on to their end, and their end notices wait in the outbox for a
caller of that name. Cancelling them would throw away paid work for what may be a
rename; the dashboard's admins can still cancel them one by one.

Measured (bench/reload.py): SIGHUP to the new token being accepted, median of 20, on a
loaded 2-core machine; see the figures in docs/decisions.md.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from . import config, fsutil, reload
from .config import Config

log = logging.getLogger("swarmbase.reload")

STATUS_FILE = "reload-status.json"
WAIT_WORTH_SAYING_S = 0.5
# Every class whose instances keep the daemon's Config as `self.cfg` (swap gives each the new one).
HOLDERS = ("Services", "RunEnv", "ClaudeEngine", "CodexEngine", "InDaemon", "CodexDenyList", "RayLauncher")


class Hangups:
    """SIGHUP, from the moment it is made (before boot) until restore(): remembered at
    once, acted on by serve() once the daemon serves. Outside the main thread (a test
    driving the daemon from a thread) signals cannot be handled, and nothing is installed."""

    def __init__(self) -> None:
        self.pending = 0
        self.asked_at = 0.0              # monotonic time of the first signal of the pending burst
        self._token: trio.lowlevel.TrioToken | None = None
        self._event: trio.Event | None = None
        self._previous: Any = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGHUP, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if not self.pending:
            self.asked_at = time.monotonic()
        self.pending += 1
        if self._token is not None:
            self._token.run_sync_soon(self._wake, idempotent=True)     # signal-safe (trio's docs)

    def _wake(self) -> None:
        if self._event is not None:
            self._event.set()

    def request(self) -> None:
        """A reload asked for from inside the daemon (tests, and the same path as a signal)."""
        if not self.pending:
            self.asked_at = time.monotonic()
        self.pending += 1
        self._wake()

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGHUP, self._previous)
            self._previous = None

    async def serve(self, reload_once: Callable[[], Awaitable[Any]]) -> None:
        """Reload once per burst of signals (several while one reload runs make one more)."""
        self._token = trio.lowlevel.current_trio_token()
        while True:
            while not self.pending:
                self._event = trio.Event()
                await self._event.wait()
            self.pending = 0
            waited = time.monotonic() - self.asked_at
            if waited > WAIT_WORTH_SAYING_S:
                # The loop was busy (or a reload was still running): part of a slow reload.
                log.info("reload: started %.1f s after it was asked for", waited)
            await reload_once()


def swap(services: Any, new: Config) -> None:
    """Give every holder of the Config (HOLDERS) the new one. Synchronous: nothing runs
    between the first assignment and the last."""
    from .caller_secrets import caller_secrets
    from .engines.codex_deny import CodexDenyList
    from .engines.claude_agent import ClaudeEngine
    from .engines.codex_agent import CodexEngine
    from .engines.think_route import ThinkRouter
    from .engines.think_run import InDaemon
    from .runs.agents import Agents
    sup = services.supervisor
    services.cfg = new
    services.env.use_config(new)            # the Supervisor, boot, flush, live runs read env.cfg
    if isinstance(sup.agents, Agents):
        engines = [e for r in sup.agents.engines.values()
                   for e in ((r.cli, r.in_daemon, r.reader) if isinstance(r, ThinkRouter) else (r,))]
        for engine in engines:
            if isinstance(engine, (ClaudeEngine, CodexEngine, InDaemon)):
                engine.cfg = new
            if isinstance(engine, CodexEngine) and isinstance(engine.deny, CodexDenyList):
                engine.deny.use(new)
    if services.ray is not None:
        services.ray.cfg = new
    for secret in caller_secrets(new):
        services.env.redact.add(secret)


async def close_sessions(hub: Any, cfg: Config) -> None:
    """Judge every open session by its own token against `cfg` (reload.session_verdict).
    Called right after the swap, with no checkpoint between: a session registering later
    is checked against `cfg` at registration (Session.serve)."""
    for session in hub.open_sessions():
        name = session.caller_name
        verdict = reload.session_verdict(cfg, name, session.token_sha256)
        if isinstance(verdict, tuple):
            log.info("closing the session of caller %s: %s", name, verdict[1])
            await session.close(*verdict)
        else:
            session.caller = verdict


def write_status(state_dir: Path, read_at: float, ok: bool, message: str,
                 phases_ms: dict[str, float] | None = None) -> None:
    """What `swarmbase reload` waits for: readAt is time.monotonic() (one clock for every
    process on the machine) when the file was read, so a reload that began before the
    command's signal never answers it."""
    body: dict[str, Any] = {"pid": os.getpid(), "readAt": read_at, "ok": ok, "message": message}
    if phases_ms is not None:
        body["phasesMs"] = phases_ms
    try:
        fsutil.write_atomic(state_dir / STATUS_FILE, (json.dumps(body) + "\n").encode(), durable=False)
    except OSError as e:
        log.error("could not write %s: %s", STATUS_FILE, e.strerror)


async def reload_once(services: Any) -> reload.Plan | None:
    """Read, validate, swap, close what must close. None: refused (the running config
    stays). A fault of our own is logged and reported, never allowed to take the daemon
    down (this runs in the daemon's main nursery)."""
    running: Config = services.cfg
    read_at = time.monotonic()
    try:
        return await _reload(services, running, read_at)
    except Exception as e:
        log.exception("reload failed")
        message = f"reload failed: internal error ({type(e).__name__}); the daemon log has the details"
        write_status(running.state_dir, read_at, False, message)
        return None


class PhaseClock:
    """Milliseconds spent in each step of one reload, in order: the log line and the status
    file carry them, so a slow reload says where its time went (issue 32.9)."""

    def __init__(self, started: float) -> None:
        self.ms: dict[str, float] = {}
        self._last = started

    def mark(self, phase: str) -> None:
        now = time.monotonic()
        self.ms[phase] = round((now - self._last) * 1000, 1)
        self._last = now

    def text(self) -> str:
        return ", ".join(f"{k} {v:g} ms" for k, v in self.ms.items())


async def _reload(services: Any, running: Config, read_at: float) -> reload.Plan | None:
    clock = PhaseClock(read_at)
    try:
        loaded = await trio.to_thread.run_sync(config.load, running.path)
        clock.mark("read")
        plan = reload.plan(running, loaded)
    except config.ConfigError as e:
        message = reload.describe_refusal(e)
        log.error("%s", message)
        write_status(running.state_dir, read_at, False, message)
        return None
    clock.mark("plan")
    swap(services, plan.config)
    services.hub.refusals.retire(running, plan.config)     # "this token was rotated", not "matches no caller"
    if "retention" in plan.applied:
        services.supervisor.retention.wake()     # a pass with the new policy now, then its interval
    clock.mark("swap")
    await close_sessions(services.hub, plan.config)
    clock.mark("sessions")
    # Callers that now have a spend quota: count their month from the records first (their
    # runs are refused as pending meanwhile; runs/quota.py).
    book = services.supervisor.quota
    await trio.to_thread.run_sync(book.prime_all, book.begin_priming(plan.config.callers))
    clock.mark("quotas")
    for name in plan.added + plan.changed:
        problem = config.key_file_problem(plan.config.caller(name).apiKeyFile)   # type: ignore[union-attr]
        if problem is not None:
            log.error("caller %s: %s; that caller's runs are refused until it is fixed", name, problem)
    clock.mark("keys")
    message = plan.summary()
    log.info("%s (took %s)", message, clock.text())
    write_status(running.state_dir, read_at, True, message, clock.ms)
    return plan
