"""Starting a script's runner: through the local launcher (sandboxed, no network, a memory
and a CPU limit), from a warm spare when one is ready (spares.py); or, for tests of the
runner itself, a plain node argv. One Runners serves every run and nested workflow."""

from __future__ import annotations

from typing import Callable

import trio

from ..config import Config
from ..jsonvalue import Json
from ..launch.spec import LaunchSpec, ProcessOpener
from ..script.host import RunnerLimits, ScriptHost, ScriptOutcome
from ..script.runner import run_script, runner_spec
from .spares import SpareRunners


class Runners:
    def __init__(self, cfg: Config, opener: ProcessOpener, limits: RunnerLimits | None = None,
                 argv: list[str] | None = None) -> None:
        self.memory_mb = cfg.runnerMemoryMb
        self.cpu_seconds = cfg.runnerCpuSeconds
        self.opener = opener
        self.argv = argv                   # a plain runner command instead of the launcher (tests)
        self.limits = limits or RunnerLimits(slice_ms=cfg.scriptSliceMs, memory_mb=cfg.runnerMemoryMb,
                                             cpu_seconds=cfg.runnerCpuSeconds)
        # Warm spare runners (single-use; see spares.py), when runners start through the launcher.
        self.spares = (SpareRunners(opener, spare_spec(cfg), cfg.spareRunners)
                       if argv is None and cfg.spareRunners > 0 else None)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the spare runners ready (nothing to do without them)."""
        if self.spares is None:
            task_status.started()
            return
        await self.spares.serve(task_status=task_status)

    async def run(self, host: ScriptHost, source: str, args: Json, *, key: str, run_id: str,
                  workflow: str = "") -> ScriptOutcome:
        """Run one script (a run's, or a nested workflow's) to its end."""
        spec = runner_spec(key=key, memory_mb=self.memory_mb, cpu_seconds=self.cpu_seconds,
                           record={"runId": run_id, "runner": True, "workflow": workflow})
        spare = self.spares.take(spec.record) if self.spares is not None else None
        if spare is None:
            return await run_script(source, args, host, self.limits, self.argv, launcher=self.opener, spec=spec)
        try:
            return await run_script(source, args, host, self.limits, launcher=self.opener, spec=spec,
                                    opened=spare.use())
        finally:
            spare.released.set()      # let its keeper kill it even if the run never got to use it


def spare_spec(cfg: Config) -> Callable[[str], LaunchSpec]:
    """A spare runner's spec: the one Runners.run would build, with a spare's key and
    nothing of any run in it."""
    return lambda key: runner_spec(key=key, memory_mb=cfg.runnerMemoryMb, cpu_seconds=cfg.runnerCpuSeconds,
                                   record={"runner": True, "spare": True})
