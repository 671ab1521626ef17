"""The codex deny list (used without the outer sandbox) is maintained as runs appear,
handed out unchanged while nothing changed, and always rendered from the list given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from swarmbase import config
from swarmbase.engines.codex_deny import CodexDenyList, codex_deny_list
from swarmbase.engines import codex
from swarmbase.runs.store import RunStore

from .conftest import write_config
from .gen_runs import generate


@attrs.define
class _Sup:
    store: RunStore
    runs: dict[str, Any]


def test_the_deny_list_grows_with_the_runs_and_is_otherwise_the_same_object(tmp_path: Path) -> None:
    path, _ = write_config(tmp_path / "state")
    cfg = config.load(path)
    runs = generate(cfg.state_dir, 30)
    sup = _Sup(RunStore(cfg.state_dir), {r.id: r for r in runs[:20]})
    deny = CodexDenyList(cfg, sup.store, sup.runs)
    first = deny()
    assert deny() is first                              # nothing changed: the very same tuple
    assert list(first) == codex_deny_list(cfg, sup.store, sup.runs)     # what a rebuild would give
    assert str(cfg.path) in first and str(cfg.state_dir / "procs") in first
    for r in runs[20:]:
        sup.runs[r.id] = r
    grown = deny()
    assert grown is not first and list(grown) == codex_deny_list(cfg, sup.store, sup.runs)
    d = sup.store.dir(runs[25])
    assert str(d / "journal.jsonl") in grown and str(d / "agents") in grown
    assert str(d / "work") not in grown                 # an agent's cwd is never denied


def test_the_rendering_follows_the_list_it_is_given() -> None:
    def toml(deny: tuple[str, ...]) -> str:
        return codex.config_toml(codex.CodexCall(bin="codex", cwd="/w", codex_home="/h", profile="read", model="m",
                                                 effort=None, meter_url="http://m", deny=deny))
    a, b = ("/s/one",), ("/s/one", "/s/two")
    assert '"/s/one" = "deny"' in toml(a) and "/s/two" not in toml(a)
    assert '"/s/two" = "deny"' in toml(b)
    assert "/s/two" not in toml(a)                      # not a stale rendering of b
    assert '= "deny"' not in toml(()).split("[permissions.swarm-read.filesystem]")[1].split("**")[0]
