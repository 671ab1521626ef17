"""What a config reload changes: pure logic, from the running Config and a freshly loaded
one to the Config that will serve next and what to tell the operator.

The Config stays immutable. A reload builds a whole new one, validates it, and the
daemon swaps it in at one place (live_reload.apply). A setting is applied live only
when every piece that uses it reads it from the Config when it uses it; settings that
something captured at start (the port Hypercorn bound, the slots sized from
maxConcurrentAgents, the dashboard's admin set, the sandbox and its user, the engines
and their meter, ...) keep their running values and are reported as "needs a restart".
Half-applying them (a new value in the Config that the captured copy ignores) would make
the Config lie about what is running, which is worse than not applying them.

The merged Config (new live settings, running restart-only settings) is validated again:
a caller that the new file allows an engine the running daemon does not have must be
refused here, not fail at its first agent.
"""

from __future__ import annotations

import hmac
from typing import Any

import attrs

from . import config
from .config import Caller, Config

# Settings read from the Config at each use (run start, agent start, log line, ...): they
# apply to what starts after the reload. Everything else needs a restart.
LIVE = frozenset({
    "callers", "prices", "perRunConcurrency", "maxAgentsPerRun", "deleteWorkOnEnd", "resumeInterruptedOnBoot",
    "agentTimeoutMs", "agentIdleTimeoutMs", "runTimeoutMs", "maxPhasesPerRun", "maxLogBytesPerRun",
    "maxWorkflowDepth", "maxWorkflowsPerRun",
    "retention",        # read at each pass; the reload wakes the pass (live_reload), which runs at once
})
NOT_KEYS = frozenset({"path"})      # Config fields that are not JSON keys

# WebSocket close codes (4000-4999 are the application's); 4000 and 4001 are mcpl/session.py's.
CLOSE_CALLER_REMOVED = 4003
CLOSE_TOKEN_ROTATED = 4004


@attrs.frozen
class Plan:
    """A validated reload: `config` serves next; the rest says what changed."""
    config: Config
    added: tuple[str, ...]
    removed: tuple[str, ...]
    rotated: tuple[str, ...]          # same name, new tokenSha256: its sessions are closed
    changed: tuple[str, ...]          # callers whose other settings changed (apply to new runs)
    applied: tuple[str, ...]          # top-level keys other than callers that changed and apply now
    needs_restart: tuple[str, ...]    # top-level keys that changed but keep their running value

    def summary(self) -> str:
        """One line for the log and for `swarmbase reload`."""
        parts = []
        for what, names in (("added", self.added), ("removed", self.removed), ("rotated the token of", self.rotated),
                            ("changed", self.changed)):
            if names:
                parts.append(f"{what} caller{'s' if len(names) > 1 else ''} {', '.join(names)}")
        if self.applied:
            parts.append("applied " + ", ".join(self._applied_text(k) for k in self.applied))
        text = "config reloaded: " + ("; ".join(parts) if parts else "nothing changed")
        if self.needs_restart:
            text += f"; needs a restart (kept the running value): {', '.join(self.needs_restart)}"
        return text

    def _applied_text(self, key: str) -> str:
        if key != "retention":
            return key
        # What a retention change does at once is worth saying: nothing waits for the interval.
        return "retention (a pass runs now)" if self.config.retention is not None else "retention (off: runs are kept)"


def keys() -> list[str]:
    return [f.name for f in attrs.fields(Config) if f.name not in NOT_KEYS]


def plan(running: Config, loaded: Config) -> Plan:
    """Raises ConfigError when the merged config does not validate (the running one stays)."""
    changed_keys = [k for k in keys() if getattr(running, k) != getattr(loaded, k)]
    restart = tuple(k for k in changed_keys if k not in LIVE)
    merged = attrs.evolve(loaded, path=running.path, **{k: getattr(running, k) for k in restart})
    if restart:
        try:
            merged = config.revalidate(merged)
        except config.ConfigError as e:
            raise config.ConfigError(f"{e} (with {', '.join(restart)} kept at the running value until a restart)") \
                from None
    old = {c.name: c for c in running.callers}
    new = {c.name: c for c in merged.callers}
    return Plan(config=merged,
                added=tuple(n for n in new if n not in old),
                removed=tuple(n for n in old if n not in new),
                rotated=tuple(n for n in new if n in old and new[n].tokenSha256 != old[n].tokenSha256),
                changed=tuple(n for n in new if n in old and new[n].tokenSha256 == old[n].tokenSha256
                              and new[n] != old[n]),
                applied=tuple(k for k in changed_keys if k in LIVE and k != "callers"),
                needs_restart=restart)


def session_verdict(cfg: Config, name: str, token_sha256: str) -> tuple[int, str] | Caller:
    """What becomes of an open session of caller `name` under `cfg`, judged by the token it
    connected with (not by what this reload changed: a session that registered while an
    earlier reload swapped, or that only an older config matched, is caught too): its new
    Caller (it goes on, and its next runs use the new settings), or the (close code,
    reason) it is closed with."""
    caller = cfg.caller(name)
    if caller is None:
        return CLOSE_CALLER_REMOVED, "the caller was removed from the daemon's config"
    if not hmac.compare_digest(caller.tokenSha256, token_sha256):
        return CLOSE_TOKEN_ROTATED, "the caller's token was rotated; reconnect with the new token"
    return caller


def describe_refusal(error: Any) -> str:
    return f"reload refused: bad config: {error}; the running config stays"
