"""`python -m swarmbase audit RUN_ID`: run dirs written as the core writes them (sealed with
the chain module), then edited the way a person might: every edit is named by file and
1-based line, an intact resumed and nested tree exits 0."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from swarmbase.audit.render import audit_command
from swarmbase.prices import Tokens

from .audit_runs import AgentSpec, lines, run_dir, write_lines, write_run


def audit(state: Path, run_id: str, as_json: bool = False) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = audit_command(state, run_id, as_json, out, err)
    return code, out.getvalue() + err.getvalue()


@pytest.fixture
def tree(tmp_path: Path):
    """An old run, a resumed run of it (one agent replayed), and a nested workflow run."""
    state = tmp_path / "state"
    old = write_run(state, [AgentSpec("a1"), AgentSpec("a2", state="failed", cost=0.02)])
    new = write_run(state, [AgentSpec("a1", replayed=True, cost=0.0, tokens=Tokens()),
                            AgentSpec("a2", cost=0.03),
                            AgentSpec("inner", workflow="3", cost=0.04),
                            AgentSpec("deeper", workflow="3/1", engine="codex", model="gpt-5", cost=0.0,
                                      priced=False, tokens=Tokens(input=5000, output=100))],
                    resumed_from=old, log=["started", "phase: main", "phase: fan-out", "done"])
    kid = write_run(state, [AgentSpec("nested-agent", cost=0.05)], nested_in=(new, "4"))
    return state, old, new, kid


def test_intact_tree_exits_0(tree) -> None:
    state, old, new, kid = tree
    code, text = audit(state, new.id)
    assert code == 0, text
    assert "verified: every chain is intact" in text
    for needle in (old.id, new.id, kid.id, "[resumed]", "[audited]", "[nested]", "workflow 3/1", "#4 deeper",
                   "no price", "(replayed)", "failed: boom", "depth 0:", "depth 1:", "depth 2:"):
        assert needle in text, needle


def test_json_totals_match_the_records(tree) -> None:
    state, old, new, kid = tree
    code, text = audit(state, new.id, as_json=True)
    report = json.loads(text)
    assert code == 0 and report["verified"] and report["break"] is None
    assert [r["runId"] for r in report["runs"]] == [old.id, new.id]
    assert report["runs"][1]["nested"][0]["runId"] == kid.id
    depths = {d["depth"]: d for d in report["totalsByDepth"]}
    # depth 0: old a1, a2 + new a1 (replayed), a2; depth 1: inner + the nested run's agent; depth 2: deeper
    assert depths[0]["agents"] == 4 and depths[0]["costUsd"] == pytest.approx(0.01 + 0.02 + 0.0 + 0.03)
    assert depths[1]["agents"] == 2 and depths[1]["costUsd"] == pytest.approx(0.04 + 0.05)
    assert depths[2]["agents"] == 1 and depths[2]["tokens"] == 5100
    assert report["totals"]["costUsd"] == pytest.approx(0.15)
    wf = report["runs"][1]["workflows"]
    assert wf["children"][0]["workflow"] == "3" and wf["children"][0]["children"][0]["agents"][0]["label"] == "deeper"


def test_edited_journal_byte(tree) -> None:
    state, old, new, kid = tree
    path = run_dir(state, new) / "journal.jsonl"
    rows = lines(path)
    rows[2] = rows[2].replace(b'"r2"', b'"r3"')
    write_lines(path, rows)
    code, text = audit(state, new.id)
    assert code == 1
    assert f"BROKEN: runs/{new.dir_name}/journal.jsonl line 3:" in text


def test_deleted_log_line(tree) -> None:
    state, old, new, kid = tree
    path = run_dir(state, old) / "log.jsonl"
    rows = lines(path)
    del rows[0]
    write_lines(path, rows)
    code, text = audit(state, new.id)          # found through the resumed run
    assert code == 1
    assert f"BROKEN: runs/{old.dir_name}/log.jsonl line 1:" in text


def test_swapped_journal_lines(tree) -> None:
    state, old, new, kid = tree
    path = run_dir(state, new) / "journal.jsonl"
    rows = lines(path)
    rows[1], rows[2] = rows[2], rows[1]
    write_lines(path, rows)
    code, text = audit(state, new.id, as_json=True)
    brk = json.loads(text)["break"]
    assert code == 1 and brk["file"] == f"runs/{new.dir_name}/journal.jsonl" and brk["line"] == 2
    assert "out of order" in brk["reason"]


def test_removed_tail(tree) -> None:
    state, old, new, kid = tree
    path = run_dir(state, kid) / "journal.jsonl"
    rows = lines(path)
    write_lines(path, rows[:-1])
    code, text = audit(state, new.id)
    assert code == 1 and f"runs/{kid.dir_name}/journal.jsonl line {len(rows)}:" in text


def test_edited_old_end_record_breaks_the_resumed_link(tree) -> None:
    """Rewriting the old run's end record consistently (new hash) still breaks the link."""
    from swarmbase.audit import chain
    state, old, new, kid = tree
    path = run_dir(state, old) / "run.json"
    data = json.loads(path.read_text())
    data["end"]["spentUsd"] = 0.001
    data["spentUsd"] = 0.001
    data["end"] = chain.seal(data["end"], data["end"]["prev"])
    path.write_text(json.dumps(data))
    code, text = audit(state, new.id)
    assert code == 1 and f"runs/{old.dir_name}/run.json line 1:" in text and new.id in text


@pytest.mark.parametrize("what", ["agent", "prompt", "run-facts", "script", "result", "extra-agent", "no-end"])
def test_other_edits(tree, what: str) -> None:
    state, old, new, kid = tree
    d = run_dir(state, new)
    if what == "agent":
        p = d / "agents" / "2" / "agent.json"
        p.write_bytes(p.read_bytes().replace(b'"costUsd":0.03', b'"costUsd":0.01'))
        want = f"runs/{new.dir_name}/agents/2/agent.json line 1"
    elif what == "prompt":
        (d / "agents" / "3" / "prompt.txt").write_text("a different prompt")
        want = f"runs/{new.dir_name}/agents/3/prompt.txt line 1"
    elif what == "run-facts":
        data = json.loads((d / "run.json").read_text())
        data["spentUsd"] = 0.0
        (d / "run.json").write_text(json.dumps(data))
        want = f"runs/{new.dir_name}/run.json line 1: spentUsd"
    elif what == "script":
        (d / "script.js").write_text("return 2")
        want = f"runs/{new.dir_name}/script.js line 1"
    elif what == "result":
        (d / "result.json").write_text('{"value": 2}\n')
        want = f"runs/{new.dir_name}/result.json line 1"
    elif what == "no-end":                      # dropping the seal would hide a removed tail
        data = json.loads((d / "run.json").read_text())
        del data["end"]
        (d / "run.json").write_text(json.dumps(data))
        want = f"runs/{new.dir_name}/run.json line 1: the run completed but has no end record"
    else:
        import shutil
        shutil.copytree(d / "agents" / "2", d / "agents" / "9")
        want = f"runs/{new.dir_name}/agents/9/agent.json line 1"
    code, text = audit(state, new.id)
    assert code == 1 and want in text, text


def test_unchained_old_run_loads(tmp_path: Path) -> None:
    state = tmp_path / "state"
    old = write_run(state, [AgentSpec("legacy")], chained=False)
    code, text = audit(state, old.id)
    assert code == 0 and "unchained" in text and "#1 legacy" in text


def test_resume_of_an_unchained_run(tmp_path: Path) -> None:
    state = tmp_path / "state"
    old = write_run(state, [AgentSpec("legacy")], chained=False)
    new = write_run(state, [AgentSpec("fresh")], resumed_from=old)
    code, text = audit(state, new.id)
    assert code == 0 and "verified: every chain is intact" in text and "unchained (written before" in text


def test_run_in_flight_is_open_not_broken(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = write_run(state, [AgentSpec("a")], status="running", sealed=False)
    code, text = audit(state, run.id)
    assert code == 0 and "no end record" in text


def test_unknown_run_and_damaged_run_json(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = write_run(state, [AgentSpec("a")])
    (run_dir(state, run) / "run.json").write_text("{torn")
    code, text = audit(state, run.id)
    assert code == 2 and "no run" in text and "cannot be read" in text


def test_the_real_command(tree) -> None:
    """python -m swarmbase audit finds the state dir through $SWARMBASE_CONFIG's folder,
    with no config file there at all."""
    state, old, new, kid = tree
    env = dict(os.environ, SWARMBASE_CONFIG=str(state / "config.json"))
    ok = subprocess.run([sys.executable, "-m", "swarmbase", "audit", new.id], env=env, capture_output=True,
                        text=True, timeout=60)
    assert ok.returncode == 0 and "every chain is intact" in ok.stdout, ok.stderr
    path = run_dir(state, new) / "log.jsonl"
    rows = lines(path)
    write_lines(path, rows[:1] + rows[2:])
    bad = subprocess.run([sys.executable, "-m", "swarmbase", "audit", new.id, "--json"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert json.loads(bad.stdout)["break"] == {"file": f"runs/{new.dir_name}/log.jsonl", "line": 2,
                                               "reason": "the entry before it is missing: a line was removed"}


def test_run_left_by_a_crash_is_sealed_from_disk(tmp_path: Path) -> None:
    """What boot's recover() does for a run a dead daemon left in flight: the chains are
    picked up from the files (a torn last line skipped) and the run is sealed as it is."""
    from swarmbase import fsutil
    from swarmbase.audit.rundirs import agent_files, chains_from_disk, end_files
    state = tmp_path / "state"
    run = write_run(state, [AgentSpec("a"), AgentSpec("b")], status="running", sealed=False)
    d = run_dir(state, run)
    with open(d / "journal.jsonl", "ab") as f:
        f.write(b'{"key":"k3:0","n":3,"res')                   # the crash, mid-append
    data = json.loads((d / "run.json").read_text())
    chains = chains_from_disk(d, data["link"])
    assert chains.journal.count == 3 and set(chains.agents) == {1, 2}
    assert set(agent_files(d / "agents" / "1")) == {"prompt.txt", "opts.json"}      # no transcript written
    run.set_status("interrupted", run.created_at + 60)
    data = {**run.to_json(), "link": data["link"]}
    data["end"] = chains.end_record(data, end_files(d))
    fsutil.write_json(d / "run.json", data)
    code, text = audit(state, run.id)
    assert code == 0 and "every chain is intact" in text and "unfinished last line" in text
    # ...and a line removed before the torn tail is still caught.
    rows = lines(d / "journal.jsonl")
    write_lines(d / "journal.jsonl", rows[:1] + rows[2:])
    assert audit(state, run.id)[0] == 1


@pytest.mark.parametrize("name", ["/etc/passwd", "../../config.json", ".."])
def test_a_record_naming_outside_files_is_a_break_and_reads_nothing_there(tmp_path: Path, name: str) -> None:
    """A forged agent record (consistently re-sealed) that names a file outside the run."""
    from swarmbase import fsutil
    from swarmbase.audit import chain
    state = tmp_path / "state"
    run = write_run(state, [AgentSpec("a")], status="running", sealed=False)      # no end record to contradict it
    p = run_dir(state, run) / "agents" / "1" / "agent.json"
    rec = json.loads(p.read_text())
    rec["files"] = {name: "0" * 64}
    fsutil.write_json(p, chain.seal(rec, rec["prev"]))
    code, text = audit(state, run.id)
    assert code == 1 and "not a file of this run" in text


def test_stripping_the_link_and_seal_does_not_make_a_run_unchained(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = write_run(state, [AgentSpec("a")])
    d = run_dir(state, run)
    data = json.loads((d / "run.json").read_text())
    del data["end"], data["link"]
    (d / "run.json").write_text(json.dumps(data))
    for name in ("journal.jsonl", "log.jsonl"):             # rewritten without hashes too
        rows = [json.loads(r) for r in (d / name).read_text().splitlines()]
        (d / name).write_text("".join(json.dumps({k: v for k, v in r.items() if k not in ("prev", "hash")}) + "\n"
                                      for r in rows))
    code, text = audit(state, run.id)
    assert code == 1 and "agents/1/agent.json is chained" in text
