"""Claude Code's Workflow call shape on the `run` tool (runs/workflow_call.py), saved
workflows found by name or meta.name, and script files read only from under cwdRoots
(runs/workflows.py): pure logic and the file system, no daemon."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import attrs
import pytest

from swarmbase.runs import workflows
from swarmbase.runs.agent_opts import unknown_option
from swarmbase.runs.budget import default_max_usd
from swarmbase.runs.run_opts import RunRefused
from swarmbase.runs.workflow_call import from_tool
from swarmbase.runs.workflow_files import PROJECT, SAVED, Found, WorkflowFileError, all_workflows, find_workflow
from swarmbase.runs.workflows import WorkflowError, find_saved, read_script_file


@attrs.frozen
class Caller:
    name: str
    cwdRoots: list[str]
    projects: dict[str, str] = attrs.Factory(dict)

    def default_project(self) -> tuple[str, str] | None:
        return next(iter(self.projects.items())) if len(self.projects) == 1 else None


@pytest.fixture
def caller(tmp_path: Path) -> Caller:
    root = tmp_path / "root"
    root.mkdir()
    return Caller("alice", [os.path.realpath(root)])


def test_script_wins_then_script_path_then_name(tmp_path: Path, caller: Caller) -> None:
    state = tmp_path / "state"
    workflows.save(state, "alice", "sub", "export const meta = { name: 'by-meta', description: 'd' }\nreturn 1")
    file = Path(caller.cwdRoots[0]) / "s.js"
    file.write_text("return 'from file'")
    assert from_tool({"script": "return 0", "scriptPath": str(file), "name": "sub"}, caller, state).params["script"] \
        == "return 0"
    assert from_tool({"scriptPath": str(file), "name": "sub"}, caller, state).params["script"] == "return 'from file'"
    by_name = from_tool({"name": "sub", "args": {"x": 1}}, caller, state)
    assert by_name.params == {"script": workflows.load_saved(state, "alice", "sub"), "args": {"x": 1}}
    assert from_tool({"name": "by-meta"}, caller, state).params["script"].endswith("return 1")


def test_title_description_and_resume(tmp_path: Path, caller: Caller) -> None:
    call = from_tool({"script": "return 1", "title": "T", "description": "D", "resumeFromRunId": "run_0123456789ab",
                      "repository": "/r", "tokenTarget": 5}, caller, tmp_path)
    assert call.resume_from == "run_0123456789ab"
    assert call.params == {"script": "return 1", "label": "T", "description": "D", "repository": "/r",
                           "tokenTarget": 5}
    assert from_tool({"script": "1", "title": "T", "label": "L"}, caller, tmp_path).params["label"] == "L"
    only_resume = from_tool({"resumeFromRunId": "run_0123456789ab"}, caller, tmp_path)
    assert "script" not in only_resume.params and only_resume.resume_from == "run_0123456789ab"


@pytest.mark.parametrize("a,why", [
    ({}, "provide the script"),
    ({"name": "missing"}, "no workflow named 'missing' in the saved workflows (this run has no project). "
                          "Available: (none)"),
    ({"scriptPath": "relative.js"}, "must be an absolute path"),
    ({"scriptPath": "/etc/passwd"}, "is not inside this caller's cwdRoots"),
])
def test_refusals(tmp_path: Path, caller: Caller, a: dict[str, Any], why: str) -> None:
    with pytest.raises(RunRefused, match=why.replace("(", r"\(").replace(")", r"\)")):
        from_tool(a, caller, tmp_path / "state")


def test_script_files_are_read_only_from_under_the_roots(tmp_path: Path, caller: Caller) -> None:
    root = Path(caller.cwdRoots[0])
    outside = tmp_path / "secret.js"
    outside.write_text("the secret")
    (root / "link.js").symlink_to(outside)
    (root / "linkdir").symlink_to(tmp_path)
    os.mkfifo(root / "fifo.js")
    (root / "big.js").write_text("x" * (workflows.MAX_SOURCE_CHARS + 1))
    (root / "bad.js").write_bytes(b"\xff\xfe")
    for name, why in [("link.js", "a symbolic link"), ("linkdir/secret.js", "not inside this caller's cwdRoots"),
                      ("fifo.js", "not a regular file"), ("big.js", "larger than"), ("bad.js", "not UTF-8"),
                      ("nope.js", "no such file")]:
        with pytest.raises(WorkflowError, match=why):
            read_script_file(str(root / name), caller.cwdRoots)
    (root / "ok.js").write_text("return 1")
    assert read_script_file(str(root / "ok.js"), caller.cwdRoots) == "return 1"


def test_saved_workflows_by_file_name_or_meta_name(tmp_path: Path) -> None:
    workflows.save(tmp_path, "alice", "a", "export const meta = { name: 'review changes', description: 'x', "
                                           "whenToUse: 'on a diff' }\nreturn 1")
    workflows.save(tmp_path, "alice", "b", "return 2")
    assert find_saved(tmp_path, "alice", "a")[0] == "a"
    assert find_saved(tmp_path, "alice", "review changes")[0] == "a"
    assert find_saved(tmp_path, "alice", "c") is None
    assert find_saved(tmp_path, "bob", "a") is None
    listed = workflows.listing(tmp_path, "alice")
    assert listed[0]["whenToUse"] == "on a diff" and listed[0]["meta"]["name"] == "review changes"
    assert "meta" not in listed[1]


@pytest.mark.parametrize("source,kind", [
    ("sub", "name"), ("review changes", "name"), ("return 1", "text"), ("await agent('x')", "text"),
    ("args.n * 2", "text"), ("x\ny", "text"),
])
def test_a_string_is_a_name_unless_it_reads_as_code(tmp_path: Path, source: str, kind: str) -> None:
    caller = Caller("alice", [])
    if kind == "name":
        with pytest.raises(WorkflowError, match=r"no workflow with that name\. Available: \(none\) \(looked in the "
                                                r"saved workflows \(this run has no project\)\)"):
            workflows._source(caller, source, tmp_path, None)
    else:
        assert workflows._source(caller, source, tmp_path, None) == (source, None)


def test_did_you_mean_and_the_default_cap() -> None:
    assert "did you mean 'model'?" in unknown_option("agent()", "modle", ("model", "label"))
    assert "did you mean 'label'?" in unknown_option("agent()", "LABEL", ("model", "label"))
    assert "did you mean" not in unknown_option("agent()", "zzz", ("model", "label"))
    assert default_max_usd(5.0, 16) == 5.0 / 16
    assert default_max_usd(0.1, 16) == 0.03          # never below the minimum reservation


def project_with(root: Path, files: dict[str, str]) -> Path:
    flows = root / "app" / ".claude" / "workflows"
    flows.mkdir(parents=True)
    for name, text in files.items():
        (flows / name).write_text(text)
    return root / "app"


def test_the_project_s_workflows_come_first_then_the_saved_ones(tmp_path: Path, caller: Caller) -> None:
    app = project_with(Path(caller.cwdRoots[0]), {
        "x.js": "return 'project x'",
        "review.js": "export const meta = { name: 'review changes', description: 'd' }\nreturn 'project review'"})
    state = tmp_path / "state"
    workflows.save(state, "alice", "x", "return 'saved x'")
    workflows.save(state, "alice", "y", "export const meta = { name: 'review changes', description: 'd' }\n"
                                        "return 'saved y'")
    workflows.save(state, "alice", "only", "return 'saved only'")
    saved = workflows.saved_dir(state, "alice")
    # Claude Code's order: the project's file name, its meta.name, then the saved ones.
    assert find_workflow(str(app), saved, "x") == Found("x", "return 'project x'", PROJECT)
    assert find_workflow(str(app), saved, "review changes").name == "review"
    assert find_workflow(str(app), saved, "only") == Found("only", "return 'saved only'", SAVED)
    assert find_workflow(None, saved, "x").script == "return 'saved x'"
    assert find_workflow(str(app), saved, "../x") is None
    # run {name}: the project asked for, else the caller's default one; none: the saved one.
    with_app = attrs.evolve(caller, projects={"app": str(app)})
    assert from_tool({"name": "x"}, with_app, state).params["script"] == "return 'project x'"
    assert from_tool({"name": "x"}, caller, state).params["script"] == "return 'saved x'"
    assert from_tool({"name": "x", "project": str(app)}, caller, state).params["script"] == "return 'project x'"
    assert from_tool({"name": "x", "repository": "app"}, with_app, state).params["script"] == "return 'project x'"
    with pytest.raises(RunRefused, match="no workflow named 'nope' in the project's .claude/workflows or the "
                                         "saved workflows. Available: review, x, only, y"):
        from_tool({"name": "nope"}, with_app, state)
    # workflow() in a script of a run in the project.
    assert workflows._source(with_app, "x", state, str(app)) == ("return 'project x'", "x")
    assert workflows._source(with_app, {"name": "only"}, state, str(app)) == ("return 'saved only'", "only")
    listed = all_workflows(str(app), saved)
    assert [(w["name"], w["source"], w.get("shadowed", False)) for w in listed] == [
        ("review", "project", False), ("x", "project", False),
        ("only", "saved", False), ("x", "saved", True), ("y", "saved", False)]
    assert listed[0]["path"] == ".claude/workflows/review.js" and listed[0]["meta"]["name"] == "review changes"


def test_a_project_workflow_is_read_only_from_inside_the_project(tmp_path: Path, caller: Caller,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    root = Path(caller.cwdRoots[0])
    app = project_with(root, {"inner.js": "return 'inner'"})
    flows = app / ".claude" / "workflows"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.js").write_text("return 'the secret'")
    (flows / "leaks.js").symlink_to(outside / "secret.js")
    (flows / "alias.js").symlink_to(flows / "inner.js")          # a link inside the project is fine
    os.mkfifo(flows / "fifo.js")
    state = tmp_path / "state"
    workflows.save(state, "alice", "leaks", "return 'saved leaks'")
    saved = workflows.saved_dir(state, "alice")
    assert find_workflow(str(app), saved, "alias").script == "return 'inner'"
    # Refused, and not replaced by the saved workflow of that name: the project's file is the one meant.
    for name, why in (("leaks", "is a link that leaves the project"), ("fifo", "is not a regular file")):
        with pytest.raises(WorkflowFileError, match=f"the project's .claude/workflows/{name}.js {why}"):
            find_workflow(str(app), saved, name)
    with pytest.raises(RunRefused, match="leaks.js is a link that leaves the project"):
        from_tool({"name": "leaks", "project": str(app)}, caller, state)
    listed = {w["name"]: w for w in all_workflows(str(app), saved) if w["source"] == "project"}
    assert listed["leaks"]["error"] == ".claude/workflows/leaks.js is a link that leaves the project"
    assert "the secret" not in json.dumps(listed)
    # The whole workflows dir a link out of the project.
    other = root / "other" / ".claude"
    other.mkdir(parents=True)
    (other / "workflows").symlink_to(outside)
    with pytest.raises(WorkflowFileError, match="secret.js is a link that leaves the project"):
        find_workflow(str(root / "other"), saved, "secret")
    # The dir swapped for such a link after the path was checked: the opened file is checked too.
    monkeypatch.setattr(os.path, "realpath", os.path.normpath)
    with pytest.raises(WorkflowFileError, match="secret.js is a link that leaves the project"):
        find_workflow(str(root / "other"), saved, "secret")
