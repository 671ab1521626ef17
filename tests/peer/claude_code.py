"""Running a script through Claude Code's own Workflow runtime (the peer), headless.

`claude -p "conformance-run <token>" --allowedTools Workflow` against the deterministic
model: the model's first main-session reply is a tool_use of Workflow carrying the call
(tests/peer/model.py), the CLI runs it in the background, waits for it, is told it
completed and exits. What the script returned is in the run's record,
`<config>/projects/<cwd slug>/<session>/workflows/<runId>.json`, its journal in
`…/<session>/subagents/workflows/<runId>/journal.jsonl`.

Resume is only possible within the same session: `claude -p --resume <session>` with a
Workflow call that carries `resumeFromRunId`. Several Workflow calls can be made in one
main-session turn (`run_many`): the CLI runs them all in the background and waits for
every one, so a batch of eight costs 2.1 CPU-s where eight CLIs cost ~9.6.

Measured on the 2-core test machine (CPU of the CLI's process tree from RUSAGE_CHILDREN,
median of 5, load average ~23 from other suites): a trivial workflow costs 1.02 CPU-s, one
with three agents 1.22 CPU-s — the CLI's start dominates, each agent is an in-process
request (~0.07 CPU-s). Wall time under that load was 2.8–3.9 s.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import attrs
import trio

from .model import DeterministicModel

CLAUDE = Path(__file__).resolve().parent.parent / ".tools" / "node_modules" / ".bin" / "claude"
RUN_ID = re.compile(r"Run ID: (wf_[0-9a-z-]+)")


class PeerError(Exception):
    """The peer did not run the workflow (or left no record of it)."""


@attrs.frozen
class PeerRun:
    status: str                      # the run record's status: completed, failed, ...
    result: Any                      # what the script returned (None when it failed)
    error: str | None
    logs: list[str]
    run_id: str
    session_id: str
    journal: list[dict[str, Any]]
    agent_count: int
    record: dict[str, Any]


@attrs.define
class ClaudeCodePeer:
    """One isolated Claude Code config dir and project dir; runs share them (resume needs that)."""
    model: DeterministicModel
    home: Path
    cwd: Path
    max_concurrent: int = 16
    runs: int = 0
    # A command the CLI is started under, its argv appended (bench/: one that enters a cgroup).
    launcher: tuple[str, ...] = ()

    def env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(self.home),
            "CLAUDE_CONFIG_DIR": str(self.home / ".claude"), "TMPDIR": str(self.home / "tmp"),
            "ANTHROPIC_BASE_URL": self.model.url, "ANTHROPIC_API_KEY": "sk-ant-peer-0000",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_MAX_RETRIES": "0", "LANG": "C.UTF-8", "TZ": "UTC",
            "CLAUDE_CODE_WORKFLOW_MAX_CONCURRENT_AGENTS": str(self.max_concurrent),
        }

    async def run(self, call: dict[str, Any], *, token_target: int | None = None,
                  resume_session: str | None = None, timeout: float = 240) -> PeerRun:
        """Run one Workflow call (its input as the Workflow tool takes it) to its end."""
        (result,) = await self.run_many([call], token_target=token_target, resume_session=resume_session,
                                        timeout=timeout)
        if isinstance(result, PeerError):
            raise result
        return result

    async def run_many(self, calls: list[dict[str, Any]], *, token_target: int | None = None,
                       resume_session: str | None = None, timeout: float = 300) -> list[PeerRun | PeerError]:
        """Run Workflow calls made together in one turn of one `claude -p` (one CLI start:
        ~1 CPU-s however many), each to its end; a call the tool refused is its PeerError.
        The runs of one batch share the turn's budget.spent(): a script that reads it must
        run alone."""
        (self.home / "tmp").mkdir(parents=True, exist_ok=True)
        self.cwd.mkdir(parents=True, exist_ok=True)
        token = self.model.expect(calls)
        # A "+N" directive in the user's prompt is how Claude Code gets a token target.
        prompt = f"conformance-run {token}" + (f" +{token_target}" if token_target is not None else "")
        argv = [*self.launcher, str(CLAUDE), "-p", prompt, "--allowedTools", "Workflow", "--output-format",
                "stream-json", "--verbose"]
        if resume_session:
            argv += ["--resume", resume_session]
        self.runs += 1
        with trio.fail_after(timeout):
            proc = await trio.run_process(argv, env=self.env(), cwd=str(self.cwd), stdin=b"", capture_stdout=True,
                                          capture_stderr=True, check=False)
        events = [json.loads(line) for line in proc.stdout.decode().splitlines() if line.startswith("{")]
        session = next((e.get("session_id") for e in events if e.get("type") == "system"), None)
        answers = {b.get("tool_use_id"): b for e in events if e.get("type") == "user"
                   for b in (e.get("message", {}).get("content") or []) if isinstance(b, dict)
                   and b.get("type") == "tool_result"}
        if proc.returncode != 0 or not session:
            failure = PeerError(f"claude -p exited {proc.returncode}: {proc.stderr.decode(errors='replace')[-600:]}")
            return [failure] * len(calls)
        out: list[PeerRun | PeerError] = []
        for i in range(len(calls)):
            answer = answers.get(f"toolu_{token}_{i}")
            text = json.dumps(answer.get("content")) if answer else ""
            m = RUN_ID.search(text)
            if m is None:
                out.append(PeerError(f"the Workflow tool did not launch call {i}: {text[:600] or 'no answer'}"))
                continue
            try:
                out.append(self.read(session, m.group(1)))
            except PeerError as e:
                out.append(e)
        return out

    def session_dir(self, session: str) -> Path:
        found = list((self.home / ".claude" / "projects").glob(f"*/{session}"))
        if len(found) != 1:
            raise PeerError(f"no session dir for {session}")
        return found[0]

    def read(self, session: str, run_id: str) -> PeerRun:
        d = self.session_dir(session)
        try:
            record = json.loads((d / "workflows" / f"{run_id}.json").read_text())
        except (OSError, ValueError) as e:
            raise PeerError(f"the workflow {run_id} left no readable record: {e}") from None
        journal_path = d / "subagents" / "workflows" / run_id / "journal.jsonl"
        journal = [json.loads(line) for line in journal_path.read_text().splitlines() if line.strip()] \
            if journal_path.exists() else []
        status = record.get("status", "?")
        return PeerRun(status=status, result=record.get("result"), error=record.get("error"),
                       logs=list(record.get("logs") or []), run_id=run_id, session_id=session, journal=journal,
                       agent_count=int(record.get("agentCount") or 0), record=record)


def cli_present() -> bool:
    return CLAUDE.exists() and os.access(CLAUDE, os.X_OK)
