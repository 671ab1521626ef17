"""What a run's script hooks do on the daemon side (the runner bridge's ScriptHost), and
starting the run's script runner through the launcher: sandboxed, no network, a memory
and a CPU limit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..runner import MAX_LOG_CHARS, Answered, ScriptOutcome, run_script, runner_spec

if TYPE_CHECKING:
    from .supervisor import LiveRun, Supervisor


class ScriptHost:
    def __init__(self, sup: "Supervisor", live: "LiveRun") -> None:
        self.sup = sup
        self.live = live

    def attach(self, bridge: Any) -> None:
        self.live.bridge = bridge

    def agent_begin(self, prompt: str, opts: dict[str, Any]) -> Any:
        agents = self.sup.agents
        begin = getattr(agents, "begin", None)
        if begin is None:
            return None
        ticket = begin(self.live, prompt, opts)
        replay_now = getattr(agents, "replay_now", None)
        if replay_now is not None:
            done, value = replay_now(self.live, prompt, opts, ticket)
            if done:
                return Answered(value)
        return ticket

    async def agent(self, prompt: str, opts: dict[str, Any], ticket: Any = None) -> Any:
        return await self.sup.agents.call(self.live, prompt, opts, ticket)

    def calls_cancelled(self, tickets: list[Any], reason: str) -> None:
        cancel = getattr(self.sup.agents, "calls_cancelled", None)
        if cancel is not None:
            cancel(self.live, tickets, reason)

    def phase(self, title: str) -> None:
        live, cfg = self.live, self.sup.cfg
        if len(live.phases) >= cfg.maxPhasesPerRun:
            self.sup.fail_run(live, f"the script called phase() more than {cfg.maxPhasesPerRun} times "
                                    f"(maxPhasesPerRun)")
            return
        live.phases.append({"title": title, "workflow": live.workflow_path, "agents": []})
        live.writes.phases_dirty = True
        self.sup.events.publish(live.run.id, "phase", {"title": title, "workflow": live.workflow_path})
        self._log(f"phase: {title}")

    def log(self, message: str) -> None:
        self._log(message)

    def _log(self, message: str) -> None:
        live, cfg = self.live, self.sup.cfg
        live.log_bytes += len(message) + 60
        if live.log_bytes > cfg.maxLogBytesPerRun:
            self.sup.fail_run(live, f"the script logged more than {cfg.maxLogBytesPerRun:,} bytes "
                                    f"(maxLogBytesPerRun)")
            return
        self.sup.record_log(live.run, message[:MAX_LOG_CHARS])

    def meta(self, meta: Any) -> None:
        if isinstance(meta, dict):
            clean = {k: str(v)[:500] for k, v in meta.items() if k in ("name", "description") and v is not None}
            self.live.run.meta = clean
            self.sup.changed(self.live.run)

    def budget_view(self) -> dict[str, Any]:
        return self.live.budget_view()


async def run_live_script(sup: "Supervisor", live: "LiveRun", host: ScriptHost) -> ScriptOutcome:
    cfg = sup.cfg
    limits = sup.limits
    spec = runner_spec(key=f"{live.run.id}-runner", memory_mb=cfg.runnerMemoryMb, cpu_seconds=cfg.runnerCpuSeconds,
                       record={"runId": live.run.id, "runner": True})
    return await run_script(sup.store.script(live.run), live.run.args, host, limits, sup.runner_argv,
                            launcher=sup.launcher, spec=spec)
