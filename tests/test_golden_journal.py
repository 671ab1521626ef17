"""Resume keeps its promise across format and language changes: a run directory written
by an older build (tests/journals/, made as tests/journals/make_golden.py says) is booted
by today's daemon and resumed; every agent replays from its journal, so no agent process
starts and the fake model API sees no request, and the result is the one recorded then.

- v1-claude was written before issue 21 moved the script language to Claude Code's
  Workflow semantics: its script uses only calls whose meaning did not change (stages that
  read only their first argument, workflow() of script text, a race), so a change that
  moves a journal key (the args digest when `args` became undefined, an option's default,
  the framing added to an agent's prompt) shows up here as a spawned agent.
- v1-first was written by 606cc9d, the first build with a journal. The key format has
  had one version (1) ever since, so this is the oldest journal there is: a run with args
  (the args digest in every key), a schema, a pinned model, effort and profile, and the
  profile default of its day (the caller's maxProfile) recorded in its run.json.
- v2-unknown is that run with its journal header claiming version 2, which no build
  writes: journal.py promises an unknown version is an error, never a guess, so resume is
  refused with the reason, and nothing starts.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import trio

from swarmbase import config
from swarmbase.runs.supervisor import RunRefused

from .conftest import CLAUDE, Env, record_opened, start_daemon, write_config
from .fakes.anthropic_api import FakeAnthropic

FIXTURES = Path(__file__).resolve().parent / "journals"


async def boot_on(fixture: str, tmp_path: Path, nursery: trio.Nursery) -> tuple[Env, FakeAnthropic, Path]:
    """Today's daemon booted on a state dir holding the fixture's run (a copy)."""
    api = await nursery.start(FakeAnthropic().serve)
    state = tmp_path / "state"
    key = tmp_path / "alice.key"
    key.write_text("sk-ant-golden-0123456789\n")
    key.chmod(0o600)
    path, tokens = write_config(state, callers=["alice"], engines={"claude": {"bin": str(CLAUDE), "baseUrl": api.url}},
                                caller_extra={"apiKeyFile": str(key), "maxProfile": "write"})
    (old_dir,) = (FIXTURES / fixture).iterdir()
    shutil.copytree(old_dir, state / "runs" / old_dir.name)
    env = await start_daemon(nursery, Env(state=state, tokens=tokens, cfg=config.load(path)))
    return env, api, old_dir


# fixture -> the agents that finished in the old run (v1-claude's race loser was cancelled
# then and is not started again).
REPLAYING = {"v1-claude": 13, "v1-first": 10}


@pytest.mark.parametrize("fixture", sorted(REPLAYING))
async def test_old_journal_replays_whole_without_spawning(fixture: str, tmp_path: Path, nursery: trio.Nursery) -> None:
    env, api, old_dir = await boot_on(fixture, tmp_path, nursery)
    old_id = json.loads((old_dir / "run.json").read_text())["id"]
    recorded = json.loads((old_dir / "result.json").read_text())["value"]
    sup = env.services.supervisor
    assert sup.runs[old_id].status == "completed"
    opened = record_opened(env.services.launcher)
    new = sup.resume(env.cfg.caller("alice"), old_id, {})
    with trio.fail_after(120):
        await sup.live[new.id].finished.wait()
    assert new.status == "completed", new.error
    assert json.loads(env.services.store.result_text(new)) == recorded
    assert [r for r in opened if not r.get("runner")] == []     # script runners only, no agent
    assert opened, "the recording saw no process at all (the root script's runner must show)"
    assert api.requests == []
    records = [json.loads(p.read_text()) for p in (env.services.store.dir(new) / "agents").glob("*/agent.json")]
    assert len(records) == REPLAYING[fixture]
    assert all(r["replayed"] and r["state"] == "done" for r in records)
    assert new.spent_usd == 0


async def test_unknown_journal_version_is_refused_with_its_reason(tmp_path: Path, nursery: trio.Nursery) -> None:
    env, api, old_dir = await boot_on("v2-unknown", tmp_path, nursery)
    old_id = json.loads((old_dir / "run.json").read_text())["id"]
    sup = env.services.supervisor
    assert sup.runs[old_id].status == "completed"      # listed as it ended: only resuming needs the journal
    opened = record_opened(env.services.launcher)
    before = set(sup.runs)
    with pytest.raises(RunRefused) as refused:
        sup.resume(env.cfg.caller("alice"), old_id, {})
    assert str(refused.value) == (f"cannot resume {old_id}: journal.jsonl: journal schema version 2 is not "
                                  f"supported (this build reads version 1)")
    assert set(sup.runs) == before and sup.live == {}   # no new run, so nothing re-runs and nothing is paid
    assert opened == [] and api.requests == []
