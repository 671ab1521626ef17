"""The read agent's tool host (swarmbase/toolhost/read_host.py) and its pure parts
(swarmbase/engines/read_tools.py): Claude Code's tool shapes, result text and path rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from swarmbase.engines import read_tools
from swarmbase.engines.read_tools import PathRules, read_rules
from swarmbase.toolhost.read_host import Tools

SDK_TYPES = Path(__file__).parent / ".tools/node_modules/@anthropic-ai/claude-code/sdk-tools.d.ts"


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "work").mkdir()
    w = tmp_path / "work"
    (w / "a.py").write_text("import os\nx = 1\n\ndef f():\n    return x\n")
    (w / "sub").mkdir()
    (w / "sub" / "b.ts").write_text("const x = 2;\nexport default x;\n")
    (w / ".env").write_text("SECRET=canary\n")
    (tmp_path / "outside.txt").write_text("outside\n")
    return w


def tools_for(work: Path) -> Tools:
    state = work.parent / "state"
    return Tools(read_rules(str(work), str(state), str(work.parent / "home"), []), str(work))


def test_schemas_use_the_cli_input_shapes() -> None:
    """Every property we declare is one the CLI's published types declare for that tool."""
    text = SDK_TYPES.read_text()
    iface = {"Read": "FileReadInput", "Grep": "GrepInput", "Glob": "GlobInput"}
    for schema in read_tools.TOOL_SCHEMAS:
        body = text.split(f"export interface {iface[schema['name']]} {{", 1)[1].split("\n}", 1)[0]
        for prop in schema["input_schema"]["properties"]:
            assert f"\n  {prop}?:" in body or f'\n  "{prop}"?:' in body or f"\n  {prop}:" in body, prop
        for req in schema["input_schema"]["required"]:
            assert f"\n  {req}:" in body, req


def test_read_numbers_lines_like_cat_n(work: Path) -> None:
    t = tools_for(work)
    assert t.call("Read", {"file_path": str(work / "a.py")}).split("\n")[:2] == ["     1\timport os", "     2\tx = 1"]
    assert t.call("Read", {"file_path": str(work / "a.py"), "offset": 4, "limit": 1}) == "     4\tdef f():"
    assert "shorter than the provided offset" in t.call("Read", {"file_path": str(work / "a.py"), "offset": 99})


def test_read_refuses_outside_the_work_dir_and_credentials(work: Path) -> None:
    t = tools_for(work)
    for path in (work.parent / "outside.txt", work / ".env", work / "sub" / ".." / ".." / "outside.txt"):
        with pytest.raises(Exception, match="denied"):
            t.call("Read", {"file_path": str(path)})


def test_a_symlink_does_not_lead_out(work: Path) -> None:
    (work / "link.txt").symlink_to(work.parent / "outside.txt")
    with pytest.raises(Exception, match="denied"):
        tools_for(work).call("Read", {"file_path": str(work / "link.txt")})


def test_state_dir_records_are_denied_even_inside_the_root(tmp_path: Path) -> None:
    rules = read_rules(str(tmp_path), str(tmp_path / "state"), str(tmp_path / "home"), [str(tmp_path / "k")])
    assert rules.allows(str(tmp_path / "state" / "runs" / "r1" / "work" / "x.txt"))
    assert not rules.allows(str(tmp_path / "state" / "runs" / "r1" / "journal.jsonl"))
    assert not rules.allows(str(tmp_path / "state" / "callers.json"))
    assert not rules.allows(str(tmp_path / "k"))
    assert not rules.allows(str(tmp_path / "home" / ".ssh" / "id_rsa"))


def test_grep_modes(work: Path) -> None:
    t = tools_for(work)
    files = t.call("Grep", {"pattern": r"x\b"})
    assert files.startswith("Found 2 files\n") and str(work / "a.py") in files
    assert ".env" not in t.call("Grep", {"pattern": "SECRET"})
    content = t.call("Grep", {"pattern": "return", "output_mode": "content", "-B": 1})
    assert content.split("\n") == [f"{work}/a.py-4-def f():", f"{work}/a.py:5:    return x"]
    assert t.call("Grep", {"pattern": "X", "-i": True, "glob": "*.{ts,tsx}", "output_mode": "count"}) \
        == f"{work}/sub/b.ts:3\n\nFound 3 total occurrences across 1 files."  # const x, eXport, x;
    assert t.call("Grep", {"pattern": "nothing-here"}) == "No files found"
    with pytest.raises(Exception, match="Invalid regular expression"):
        t.call("Grep", {"pattern": "("})


def test_glob(work: Path) -> None:
    t = tools_for(work)
    assert t.call("Glob", {"pattern": "**/*.ts"}) == f"{work}/sub/b.ts"
    assert set(t.call("Glob", {"pattern": "**/*"}).split("\n")) == {f"{work}/a.py", f"{work}/sub/b.ts"}
    assert t.call("Glob", {"pattern": "*.rs"}) == "No files found"


def test_host_process_speaks_json_lines(work: Path) -> None:
    """The real host process: setup line, calls answered in order, errors as tool results, no
    secrets in its environment needed (it gets an empty one)."""
    rules = read_rules(str(work), str(work.parent / "state"), str(work.parent / "home"), [])
    lines = [{"rules": rules.to_json(), "cwd": str(work)},
             {"id": "t1", "name": "Read", "input": {"file_path": str(work / "a.py"), "limit": 1}},
             {"id": "t2", "name": "Read", "input": {"file_path": str(work / ".env")}},
             {"id": "t3", "name": "Bash", "input": {"command": "id"}},
             {"id": "t4", "name": "Glob", "input": {"pattern": "**/*.py"}}]
    src = str(Path(__file__).parent.parent)
    proc = subprocess.run([sys.executable, "-m", "swarmbase.toolhost.read_host"],
                          input="".join(json.dumps(x) + "\n" for x in lines), capture_output=True, text=True,
                          timeout=30, cwd=str(work), env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": src})
    assert proc.returncode == 0, proc.stderr
    answers = [json.loads(x) for x in proc.stdout.splitlines()]
    assert [a["id"] for a in answers] == ["t1", "t2", "t3", "t4"]
    assert answers[0] == {"id": "t1", "content": "     1\timport os", "is_error": False}
    assert answers[1]["is_error"] and "denied" in answers[1]["content"] and "canary" not in answers[1]["content"]
    assert answers[2]["is_error"] and "No such tool" in answers[2]["content"]
    assert answers[3]["content"] == f"{work}/a.py"


def test_rules_round_trip() -> None:
    r = PathRules(roots=("/w",), deny=("**/.env",))
    assert PathRules.from_json(json.loads(json.dumps(r.to_json()))) == r
