"""What codex's own sandbox must not read when SwarmBase's is off: the daemon's secrets and
every run's records, kept up to date as runs appear."""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..config import Config
from ..runs.model import Run
from ..runs.store import RunStore


def codex_deny_list(cfg: Config, store: RunStore, runs: Mapping[str, Run]) -> list[str]:
    """Without the sandbox, what codex's own sandbox must not read: the daemon's secrets
    and every run's records, from the runs the supervisor already knows (no disk walk)."""
    return list(CodexDenyList(cfg, store, runs)())


class CodexDenyList:
    """codex_deny_list, maintained rather than rebuilt per agent: the run part grows as
    runs appear (it is only ever appended to; a run's records never stop being denied),
    and the same tuple is handed out while nothing changed, so the engine can reuse its
    rendering. With 10,000 runs, rebuilding it took 290 ms of the event loop per codex
    agent (and rendering it 80 ms more)."""

    def __init__(self, cfg: Config, store: RunStore, runs: Mapping[str, Run]) -> None:
        self.cfg = cfg
        self.store = store
        self.runs = runs
        self.known: set[str] = set()
        self.paths: tuple[str, ...] = ()
        self.fixed: tuple[str, ...] | None = None

    def use(self, cfg: Config) -> None:
        """A reloaded config: its callers' key files are denied from the next agent on."""
        self.cfg = cfg
        self.fixed = None
        self.known.clear()

    def __call__(self) -> tuple[str, ...]:
        from . import codex
        if self.fixed is None:
            self.fixed = tuple(codex.secret_paths(self.cfg.state_dir, [c.apiKeyFile for c in self.cfg.callers
                                                                      if c.apiKeyFile],
                                                  self.cfg.path, os.path.expanduser("~")))
            self.paths = self.fixed
        runs = self.runs
        if len(runs) != len(self.known):
            new = [r for rid, r in runs.items() if rid not in self.known]
            self.known.update(r.id for r in new)
            # An archived run's files are under runs-archive/, denied whole by secret_paths.
            self.paths = self.paths + tuple(p for r in new if r.archived_at is None
                                            for p in codex.run_paths(self.store.dir(r)))
        return self.paths
