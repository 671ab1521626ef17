"""How tests/journals/v1-claude/ was made (issue 21): a run of GOLDEN_SCRIPT through an
in-process daemon on the real claude CLI against the fake Messages API, with the code of
main at abe7b5f, i.e. *before* the language moved to Claude Code's Workflow semantics.
The run's dir is copied here whole (run.json, script.js, journal.jsonl, result.json, the
agents' records); tests/test_golden_journal.py resumes it and must spawn no agent.

Run it again only to make a *new* fixture with a new name: the point of the old one is
that it was written by the old code.

    PYTHONPATH=$PWD python3 tests/journals/make_golden.py tests/journals/<name>
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from swarmbase import config, daemon  # noqa: E402
from tests.conftest import CLAUDE, write_config  # noqa: E402
from tests.fakes.anthropic_api import FakeAnthropic  # noqa: E402

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


async def main(out: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="golden-"))
    state = tmp / "state"
    state.mkdir()
    key = state / "alice.key"
    key.write_text("sk-ant-golden-0123456789\n")
    key.chmod(0o600)
    path, _ = write_config(state, callers=["alice"], engines={"claude": {"bin": str(CLAUDE), "baseUrl": None}},
                           caller_extra={"apiKeyFile": str(key), "maxProfile": "write"}, perRunConcurrency=8)
    async with trio.open_nursery() as n:
        api = await n.start(FakeAnthropic().serve)
        raw = json.loads(path.read_text())
        raw["engines"]["claude"]["baseUrl"] = api.url
        path.write_text(json.dumps(raw))
        cfg = config.load(path)
        _, services = await n.start(lambda task_status: daemon.serve(cfg, task_status=task_status))
        sup = services.supervisor
        run = sup.start(cfg.caller("alice"), {"script": GOLDEN_SCRIPT})
        with trio.fail_after(300):
            await sup.live[run.id].finished.wait()
        assert run.status == "completed", run.error
        src = services.store.dir(run)
        out.mkdir(parents=True)
        shutil.copytree(src, out / src.name, ignore=shutil.ignore_patterns("work"))
        print(src.name, services.store.result_text(run))
        n.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main, Path(sys.argv[1]).resolve())
