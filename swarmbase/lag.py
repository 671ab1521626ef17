"""Event-loop lag: how late the loop wakes a task that asked to sleep a short tick.

Every task of the daemon (MCPL sessions, SSE viewers, the bridge to each runner, agents'
stream readers) waits on the one Trio loop; a step that holds it (a blocking write, an
fsync, a long serialisation, a GIL held by a thread) delays all of them by as much. The
probe measures exactly that at the cost of one wake-up per tick, ticking fast only while
the daemon has runs in flight (an idle daemon stays near 0 % CPU); the figures over the
last window are served (dashboard /streams) and printed by bench/.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

import trio

# While the daemon has work. A wake-up costs 0.1 to 0.6 ms of CPU (the latter at load 40):
# at 20 ms the probe alone was 13 ms of CPU a second, 40 % of the daemon's own CPU per
# agent next to `read` CLI agents (issue 23 item 3: bench/peer_workflow.py --cases read-40);
# at 100 ms it is 3 ms a second. A stall shorter than a tick is caught when it overlaps a
# wake-up (so in proportion to its length); one of a tick or more, always.
TICK_S = 0.1
IDLE_TICK_S = 1.0      # while it has none: an idle daemon stays near 0 % CPU
WINDOW = 300           # samples kept: about 30 s of a busy loop


class LagProbe:
    def __init__(self, tick: float = TICK_S, window: int = WINDOW, busy: Callable[[], bool] = lambda: True,
                 idle_tick: float = IDLE_TICK_S) -> None:
        self.tick = tick
        self.idle_tick = idle_tick
        self.busy = busy
        self.samples: deque[float] = deque(maxlen=window)     # seconds late, newest last
        self.on_sample: Callable[[float], None] | None = None  # e.g. the /metrics histogram

    async def run(self) -> None:
        while True:
            tick = self.tick if self.busy() else self.idle_tick
            t = trio.current_time()
            await trio.sleep(tick)
            late = max(0.0, trio.current_time() - t - tick)
            self.samples.append(late)
            if self.on_sample is not None:
                self.on_sample(late)

    def figures(self) -> dict[str, Any]:
        """p50/p99/max lag in ms over the window (None before the first sample)."""
        xs = sorted(self.samples)
        if not xs:
            return {"samples": 0, "p50Ms": None, "p99Ms": None, "maxMs": None}

        def at(q: float) -> float:
            return round(xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))] * 1000, 2)
        return {"samples": len(xs), "p50Ms": at(0.5), "p99Ms": at(0.99), "maxMs": round(xs[-1] * 1000, 2)}
