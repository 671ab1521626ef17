"""How the golden run dirs under tests/journals/ were made: one run of a fixture's script
through an in-process daemon of *the build under test's feet at the time*, on the real
claude CLI (tests/.tools, 2.1.328 throughout) against that build's own fake Messages API;
the run's dir is copied whole (run.json, script.js, journal.jsonl, result.json, the agents'
records). tests/test_golden_journal.py boots today's daemon on each and resumes it.

- v1-claude: main at abe7b5f, before issue 21 moved the language to Claude Code's Workflow
  semantics (GOLDEN_SCRIPT: calls whose meaning did not change).
- v1-first: 606cc9d, the first build with a journal (the key format has had one version,
  1, since then: `git log -p -- swarmbase/runs/journal.py`), so the oldest journal a
  resume must still read (FIRST_SCRIPT: what that build's runner offered, with args).
- v2-unknown: deliberately incompatible, made from v1-first by `unknown_version` (no
  daemon): the same run without its agents' records, its journal header's version set to
  2, a version no build writes. A resume must refuse it and say why.

The build is the one on PYTHONPATH (its `swarmbase` and its `tests.fakes`), e.g. for the
first one: `git archive 606cc9d | tar -x -C /tmp/b606` then

    PYTHONPATH=/tmp/b606 python3 tests/journals/make_golden.py v1-first tests/journals/v1-first
    python3 tests/journals/make_golden.py v2-unknown tests/journals/v2-unknown

Run it again only to make a *new* fixture with a new name: the point of an old one is
that it was written by the old code.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

import trio

from swarmbase import config, daemon
from tests.fakes.anthropic_api import FakeAnthropic

CLAUDE = Path(__file__).resolve().parent.parent / ".tools" / "node_modules" / ".bin" / "claude"

# Only features whose calls stay the same across the change (see the test's docstring).
GOLDEN_SCRIPT = r"""export const meta = { name: "golden-v1", description: "a journal written before issue 21" };
phase("one");
const plain = await agent("golden plain [[text:alpha]]", { label: "plain" });
const schema = { type: "object", properties: { score: { type: "integer" } }, required: ["score"] };
const rated = await agent('golden rate [[structured:{"score": 3}]]', { schema });
const tuned = await agent("golden tuned [[text:beta]]", { model: "claude-sonnet-4-5", effort: "low", profile: "think" });
phase("two");
const fan = await parallel([1, 2, 3].map((i) => () => agent(`golden fan ${i} [[text:fan${i}]]`)));
const again = await parallel([0, 1].map(() => () => agent("golden same [[text:same]]")));
const piped = await pipeline(["x", "y"], (v) => agent(`golden pipe ${v} [[text:pipe-${v}]]`), (r) => r.toUpperCase());
const child = await workflow("return await agent('golden child ' + args.n + ' [[text:kid]]')", { n: 7 });
const won = await race([() => agent("golden race [[text:winner]]"), () => agent("golden loser [[sleep:60]]")]);
const detail = await agent("golden detail [[text:gamma]]", { detail: true });
return { plain, rated, tuned, fan, again, piped, child, won, detail: detail.value };
"""

# 606cc9d's runner: agent, parallel, pipeline, phase, log, args; no workflow() or race.
FIRST_SCRIPT = r"""export const meta = { name: "golden-first", description: "a journal written by its first build" };
phase("one");
log("first build");
const plain = await agent("first plain [[text:alpha]]", { label: "plain" });
const schema = { type: "object", properties: { score: { type: "integer" } }, required: ["score"] };
const rated = await agent('first rate [[structured:{"score": 4}]]', { schema });
const tuned = await agent("first tuned [[text:beta]]", { model: "claude-sonnet-4-5", effort: "low", profile: "think" });
phase("two");
const fan = await parallel(args.items.map((i) => () => agent(`first fan ${i} about ${args.topic} [[text:fan${i}]]`)));
const again = await parallel([0, 1].map(() => () => agent("first same [[text:same]]")));
const piped = await pipeline(["x", "y"], (v) => agent(`first pipe ${v} [[text:pipe-${v}]]`), (r) => r.toUpperCase());
return { plain, rated, tuned, fan, again, piped, topic: args.topic };
"""

FIXTURES = {"v1-claude": (GOLDEN_SCRIPT, None), "v1-first": (FIRST_SCRIPT, {"topic": "trio", "items": [1, 2, 3]})}


def write_config(state: Path, key: Path, base_url: str) -> Path:
    """One caller, alice, in the config shape every build since 606cc9d reads."""
    token = secrets.token_hex(24)
    (state / "mcpl-alice.token").write_text(token)
    caller = {"name": "alice", "tokenSha256": hashlib.sha256(token.encode()).hexdigest(), "maxActiveRuns": 3,
              "runUsdMax": 25, "apiKeyFile": str(key), "maxProfile": "write"}
    path = state / "config.json"
    path.write_text(json.dumps({"port": 0, "callers": [caller], "perRunConcurrency": 8,
                                "engines": {"claude": {"bin": str(CLAUDE), "baseUrl": base_url}}}))
    return path


def unknown_version(out: Path) -> None:
    (src,) = (Path(__file__).resolve().parent / "v1-first").iterdir()
    shutil.copytree(src, out / src.name, ignore=shutil.ignore_patterns("agents"))
    journal = out / src.name / "journal.jsonl"
    head, *body = journal.read_text().splitlines(keepends=True)
    journal.write_text(json.dumps({**json.loads(head), "v": 2}, separators=(",", ":")) + "\n" + "".join(body))


async def main(name: str, out: Path) -> None:
    script, args = FIXTURES[name]
    state = Path(tempfile.mkdtemp(prefix="golden-")) / "state"
    state.mkdir()
    key = state / "alice.key"
    key.write_text("sk-ant-golden-0123456789\n")
    key.chmod(0o600)
    async with trio.open_nursery() as n:
        api = await n.start(FakeAnthropic().serve)
        cfg = config.load(write_config(state, key, api.url))
        _, services = await n.start(lambda task_status: daemon.serve(cfg, task_status=task_status))
        sup = services.supervisor
        run = sup.start(cfg.caller("alice"), {"script": script, **({"args": args} if args is not None else {})})
        with trio.fail_after(300):
            await sup.live[run.id].finished.wait()
        assert run.status == "completed", run.error
        src = services.store.dir(run)
        out.mkdir(parents=True)
        shutil.copytree(src, out / src.name, ignore=shutil.ignore_patterns("work"))
        print(src.name, services.store.result_text(run))
        n.cancel_scope.cancel()


if __name__ == "__main__":
    if sys.argv[1] == "v2-unknown":
        unknown_version(Path(sys.argv[2]).resolve())
    else:
        trio.run(main, sys.argv[1], Path(sys.argv[2]).resolve())
