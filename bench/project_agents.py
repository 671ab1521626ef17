"""What reading a project's agent types costs when a run starts (issue 28 item 2):
`project_agents.scan` over a project with N `.claude/agents/*.md` files, as the supervisor
calls it (in a thread) before the script runs. Cold (first scan after writing) and warm.

    .venv/bin/python bench/project_agents.py [--files 50] [--repeat 200]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import summary  # type: ignore[import-not-found]

from swarmbase.runs import project_agents

BODY = "You are a careful engineer. " * 60     # ~1.7 KB, the size of a typical agent file's body


def make(project: Path, n: int) -> None:
    folder = project / ".claude" / "agents"
    folder.mkdir(parents=True)
    for i in range(n):
        tools = "Read, Grep, Glob" if i % 2 else "Read, Edit, Write, Bash"
        (folder / f"agent-{i}.md").write_text(f"---\nname: agent-{i}\ndescription: Agent number {i}\n"
                                              f"tools: {tools}\nmodel: sonnet\ncolor: blue\n---\n{BODY}\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=200)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        project = Path(d)
        make(project, a.files)
        t = time.perf_counter()
        first = project_agents.scan(project)
        cold = (time.perf_counter() - t) * 1000
        assert len(first.types) == a.files and not first.broken
        times = []
        for _ in range(a.repeat):
            t = time.perf_counter()
            project_agents.scan(project)
            times.append((time.perf_counter() - t) * 1000)
    print(f"scan of {a.files} agent files: first {cold:.2f} ms; then {summary(times)}")


if __name__ == "__main__":
    main()
