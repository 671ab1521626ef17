"""Resume keeps its promise across format and language changes: a run directory written
by an older build (tests/journals/, made as tests/journals/make_golden.py says) is booted
by today's daemon and resumed; every agent replays from its journal, so no agent process
starts and the fake model API sees no request, and the result is the one recorded then.

v1-claude was written before issue 21 moved the script language to Claude Code's
Workflow semantics: its script uses only calls whose meaning did not change (stages that
read only their first argument, workflow() of script text, a race), so a change that
moves a journal key (the args digest when `args` became undefined, an option's default,
the framing added to an agent's prompt) shows up here as a spawned agent."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import trio

from swarmbase import config

from .conftest import CLAUDE, Env, start_daemon, write_config
from .fakes.anthropic_api import FakeAnthropic

FIXTURES = Path(__file__).resolve().parent / "journals"


async def test_v1_journal_replays_whole_without_spawning(tmp_path: Path, nursery: trio.Nursery) -> None:
    api = await nursery.start(FakeAnthropic().serve)
    state = tmp_path / "state"
    key = tmp_path / "alice.key"
    key.write_text("sk-ant-golden-0123456789\n")
    key.chmod(0o600)
    path, tokens = write_config(state, callers=["alice"], engines={"claude": {"bin": str(CLAUDE), "baseUrl": api.url}},
                                caller_extra={"apiKeyFile": str(key), "maxProfile": "write"})
    (old_dir,) = (FIXTURES / "v1-claude").iterdir()
    shutil.copytree(old_dir, state / "runs" / old_dir.name)
    old_id = json.loads((old_dir / "run.json").read_text())["id"]
    recorded = json.loads((old_dir / "result.json").read_text())["value"]
    env = await start_daemon(nursery, Env(state=state, tokens=tokens, cfg=config.load(path)))
    sup = env.services.supervisor
    assert sup.runs[old_id].status == "completed"
    launcher = env.services.launcher
    opened: list[dict] = []
    real_open = launcher.open

    def recording_open(spec, **kw):        # every process the daemon starts goes through here
        opened.append(dict(spec.record))
        return real_open(spec, **kw)
    launcher.open = recording_open
    new = sup.resume(env.cfg.caller("alice"), old_id, {})
    with trio.fail_after(120):
        await sup.live[new.id].finished.wait()
    assert new.status == "completed", new.error
    assert json.loads(env.services.store.result_text(new)) == recorded
    assert [r for r in opened if not r.get("runner")] == []     # script runners only, no agent
    assert opened, "the recording saw no process at all (the root script's runner must show)"
    assert api.requests == []
    records = [json.loads(p.read_text()) for p in (env.services.store.dir(new) / "agents").glob("*/agent.json")]
    # 13 agents finished in the old run (the race's loser was cancelled and is not started again).
    assert len(records) == 13 and all(r["replayed"] and r["state"] == "done" for r in records)
    assert new.spent_usd == 0
