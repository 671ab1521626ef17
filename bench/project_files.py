"""The cost of a project's workflow files (issue 28 item 3).

    python3 bench/project_files.py [--workflows 20] [--saved 10] [--lines 150] [--n 200]

Writes a project with `--workflows` files in .claude/workflows/ (each a meta block and
`--lines` lines of script, the size residents write) and `--saved` saved workflows, then
measures with runs/workflow_files.py, median of `--n` calls each:
  - list: all_workflows (what the `workflows` tool does: reads and parses every file);
  - find by file name: find_workflow of a project file's name (what `run {name}` or
    `workflow('name')` adds to a call: one listdir, one checked read);
  - find by meta.name: the last project file's meta.name (every project file read);
  - a saved name: one the project does not have (the project read, then the saved file).
Prints the figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Callable

import common

from swarmbase.runs import workflow_files


def script(i: int, lines: int) -> str:
    body = "\n".join(f"const r{k} = await agent('step {k} of flow {i}: ' + args.topic, {{ label: 's{k}' }});"
                     for k in range(lines))
    return (f"export const meta = {{ name: 'flow number {i}', description: 'workflow {i}', whenToUse: 'when {i}', "
            f"phases: [{{ title: 'one' }}, {{ title: 'two' }}] }}\n{body}\nreturn r0;\n")


def timed(n: int, fn: Callable[[], object]) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workflows", type=int, default=20)
    ap.add_argument("--saved", type=int, default=10)
    ap.add_argument("--lines", type=int, default=150)
    ap.add_argument("--n", type=int, default=200)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sb-bench-pfiles-") as tmp:
        project, saved = Path(tmp) / "app", Path(tmp) / "saved"
        flows = project / ".claude" / "workflows"
        flows.mkdir(parents=True)
        saved.mkdir()
        for i in range(a.workflows):
            (flows / f"flow-{i:02d}.js").write_text(script(i, a.lines))
        for i in range(a.saved):
            (saved / f"mine-{i:02d}.js").write_text(script(100 + i, a.lines))
        size = sum(p.stat().st_size for p in flows.iterdir())
        print(f"{a.workflows} project workflows ({size / 1024:.0f} KiB), {a.saved} saved, {a.lines} lines each")
        last = f"flow number {a.workflows - 1}"
        for what, fn in (
                ("list (all_workflows)", lambda: workflow_files.all_workflows(str(project), saved)),
                ("find by file name", lambda: workflow_files.find_workflow(str(project), saved, "flow-00")),
                ("find by meta.name", lambda: workflow_files.find_workflow(str(project), saved, last)),
                ("a saved name", lambda: workflow_files.find_workflow(str(project), saved, "mine-00"))):
            print(f"  {what}: {common.summary(timed(a.n, fn))}")


if __name__ == "__main__":
    main()
