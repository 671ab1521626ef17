"""One agent's process, once it holds its slots and its reservation: the caller's key,
its cwd (the run's work dir, the caller's dir, or a fresh worktree), the job handed to its
engine, the engine's run and the schema nudges after it, under the agent's timeout.

Everything here that touches the disk runs in a worker thread (the key file, making the
work dir): the event loop serves every other agent and viewer meanwhile.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from pathlib import Path
from typing import Mapping

import attrs
import trio

from .. import fsutil
from ..config import empty_key_file, key_file_problem
from ..engines.base import AgentIO, AgentJob, Engine, LiveUsage
from ..engines.verdict import Verdict
from ..jsonvalue import Json
from ..launch.spec import Launcher, ProcessOpener
from ..script.bridge import AgentCallError
from . import answers, nudge, worktrees
from .agent_opts import AgentOptions
from .budget import MIN_USD
from .env import RunEnv
from .git_sandbox import SandboxedGit
from .live import LiveRun
from .model import Run, iso
from .records import AgentRecord, Transcript

log = logging.getLogger("swarmbase.agents")

LIVE_PUBLISH_S = 0.5       # a running agent's usage reaches viewers at most this often


@attrs.frozen
class Launch:
    """What one agent's launch needs: the reservation it runs under and where it runs."""
    rec: AgentRecord
    o: AgentOptions
    prompt: str
    reserved: float
    reserved_tokens: int
    usage: LiveUsage
    launcher: Launcher


class AgentLauncher:
    def __init__(self, env: RunEnv, engines: Mapping[str, Engine], opener: ProcessOpener, git: SandboxedGit) -> None:
        self.env = env
        self.engines = engines
        self.opener = opener           # hands the run's work dir and worktrees to the caller's uid
        self.git = git

    async def run(self, live: LiveRun, a: Launch) -> Verdict:
        run, rec, o = live.run, a.rec, a.o
        api_key = await self._read_key(live)
        # A caller's cwd is checked again at launch, under its roots; the run's work/ (and a
        # worktree) are the daemon's own, handed to the caller's uid.
        roots = tuple(live.caller.cwdRoots) if o.cwd else ()
        state_dirs: tuple[str, ...] = ()
        if o.cwd is not None:
            cwd = o.cwd
        else:
            cwd = await trio.to_thread.run_sync(self._own_work_dir, run)
            state_dirs = (cwd,)
        caller_paths: tuple[str, ...] = (cwd,) if o.cwd else ()
        wt = None
        git = self.git.for_caller(run.caller)
        if o.isolation == "worktree":
            try:
                wt = await worktrees.create(cwd, self.env.store.dir(run) / "worktrees", run.id, rec.n, o.base,
                                            git=git, roots=roots or state_dirs, keep=self.env.keeps_work(run),
                                            adopt=functools.partial(self.opener.adopt, owner=run.caller))
            except worktrees.WorktreeError as e:
                raise AgentCallError(str(e)) from None
            cwd = wt.cwd
            state_dirs += (wt.path,)
            caller_paths = (wt.common, wt.gitdir) if o.cwd else ()
        rec.cwd = cwd
        job = AgentJob(run_id=run.id, n=rec.n, label=rec.label, engine=o.engine, model=o.model, effort=o.effort,
                       profile=o.profile, schema=o.schema, prompt=a.prompt, cwd=cwd, api_key=api_key,
                       max_usd=a.reserved, max_tokens=a.reserved_tokens, caller_max_profile=live.caller.maxProfile,
                       timeout_ms=o.timeout_ms,
                       secret_files=tuple(p for p in [live.caller.apiKeyFile, str(self.env.cfg.path)] if p),
                       extra_read=(wt.common,) if wt else (), extra_write=(wt.path, wt.gitdir) if wt else (),
                       state_dirs=state_dirs, cwd_roots=roots, caller_paths=caller_paths,
                       network=tuple(live.caller.network), disallowed_tools=o.disallowed_tools,
                       caller=run.caller, system_prompt=o.system_prompt)
        try:
            return await self._turns(live, a, job)
        finally:
            if wt is not None:
                with trio.CancelScope(shield=True):
                    try:
                        rec.branch = await worktrees.finish(wt, rec.n, rec.label, keep=self.env.keeps_work(run),
                                                            git=git)
                    except worktrees.WorktreeError as e:
                        log.error("agent %s/%d: its worktree could not be committed: %s", run.id, rec.n, e)
                        rec.branch = {"branch": wt.branch, "commit": None, "error": str(e)}

    def _own_work_dir(self, run: Run) -> str:
        """The run's work dir, made if new and handed to the caller's uid (in a thread)."""
        cwd = os.path.realpath(self.env.store.work_dir(run))
        os.makedirs(cwd, exist_ok=True)
        self.opener.adopt(cwd, run.caller)
        return cwd

    async def _turns(self, live: LiveRun, a: Launch, job: AgentJob) -> Verdict:
        """The agent's process, and the schema nudges that follow it."""
        run, rec, o, usage = live.run, a.rec, a.o, a.usage
        last = [0.0]

        def usage_changed() -> None:
            now = time.monotonic()
            if now - last[0] >= LIVE_PUBLISH_S:
                last[0] = now
                live.agent_changed(rec, usage_only=True)

        def started(where: Mapping[str, Json]) -> None:
            rec.node = where.get("node") if isinstance(where.get("node"), str) else None
            if rec.state == "waiting-node":          # placed: the CLI runs on its node now
                rec.set_state("running", **({"node": rec.node} if rec.node else {}))
                live.agent_changed(rec)

        events = self.env.events
        transcript = Transcript(rec.dir / "transcript.jsonl", self.env.redact,
                                on_entry=lambda entry: events.publish_agent_line(run.id, rec.n, entry))
        engine = self.engines[o.engine]
        done = LiveUsage()                       # what finished turns (schema nudges) used

        def turn_io() -> AgentIO:
            turn = LiveUsage()

            def changed() -> None:
                usage.tokens, usage.cost_usd = done.tokens + turn.tokens, done.cost_usd + turn.cost_usd
                usage.responses, usage.priced = done.responses + turn.responses, turn.priced
                usage_changed()
            return AgentIO(launcher=a.launcher, transcript=transcript.append, usage=turn,
                           usage_changed=changed, started=started)

        try:
            with trio.move_on_after(o.timeout_ms / 1000) as deadline:
                io = turn_io()
                verdict = total = await engine.run(job, io)
                attempt = 0
                while verdict.schema_error and attempt < o.schema_retries:
                    left = a.reserved - (total.cost_usd or 0.0)
                    if left < MIN_USD:
                        break
                    attempt += 1
                    done.tokens, done.cost_usd = total.tokens, total.cost_usd or 0.0
                    done.responses += max(io.usage.responses, 1)
                    transcript.append(json.dumps({"type": "swarmbase", "subtype": "schema-nudge", "attempt": attempt,
                                                  "schemaError": verdict.schema_error}).encode())
                    rec.history.append({"state": "running", "at": iso(time.time()), "schemaRetry": attempt,
                                        "schemaError": verdict.schema_error})
                    io = turn_io()
                    verdict = await engine.run(attrs.evolve(job, prompt=nudge.prompt(a.prompt, verdict, attempt),
                                                            max_usd=left), io)
                    total = nudge.add(total, verdict)
                verdict = total
        finally:
            # Its fsync in a worker thread: an fsync per agent on the loop stalled every
            # viewer and every other agent for its duration.
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(transcript.close)
            if transcript.fault is not None:
                why = fsutil.describe_disk_fault(transcript.fault, self.env.cfg.state_dir)
                log.error("agent %s/%d: its transcript stops after %d lines: %s", run.id, rec.n, transcript.lines, why)
                rec.history.append({"state": rec.state, "at": iso(time.time()),
                                    "transcriptIncomplete": f"after {transcript.lines} lines: {why}"})
        rec.priced = usage.priced
        if deadline.cancelled_caught:
            return Verdict(ok=False, error=f"timed out after {o.timeout_ms} ms", cost_usd=answers.killed_cost(usage),
                           tokens=usage.tokens, tokens_exact=usage.responses == 0)
        rec.exit_code = verdict.exit_code
        return verdict

    async def _read_key(self, live: LiveRun) -> str:
        """The caller's key, read at each launch (a rotated key is used, and redacted, from
        then on); in a worker thread, as the file may sit on a slow disk."""
        path = live.caller.apiKeyFile
        if not path:
            raise AgentCallError(f"agent(): caller {live.caller.name!r} has no apiKeyFile; the engine has no key")
        problem = await trio.to_thread.run_sync(key_file_problem, path)
        if problem is not None:
            raise AgentCallError(f"agent(): {problem}")
        try:
            key = (await trio.to_thread.run_sync(Path(path).read_text)).strip()
        except OSError as e:
            raise AgentCallError(f"agent(): cannot read the caller's apiKeyFile: {e.strerror}") from None
        if not key:
            raise AgentCallError(f"agent(): {empty_key_file(path)}")
        self.env.redact.add(key)          # a rotated key is redacted from then on
        return key
