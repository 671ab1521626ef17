"""Event-loop lag: how late the loop wakes a task that asked to sleep a short tick.

Every task of the daemon (MCPL sessions, SSE viewers, the bridge to each runner, agents'
stream readers) waits on the one Trio loop; a step that holds it (a blocking write, an
fsync, a long serialisation, a GIL held by a thread) delays all of them by as much. The
probe measures exactly that, all the time, at a cost of one wake-up per tick; the figures
over the last window are served (dashboard /streams) and printed by bench/.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import trio

TICK_S = 0.01
WINDOW = 3000          # samples kept: about 30 s at one per tick when the loop is idle


class LagProbe:
    def __init__(self, tick: float = TICK_S, window: int = WINDOW) -> None:
        self.tick = tick
        self.samples: deque[float] = deque(maxlen=window)     # seconds late, newest last

    async def run(self) -> None:
        while True:
            t = trio.current_time()
            await trio.sleep(self.tick)
            self.samples.append(max(0.0, trio.current_time() - t - self.tick))

    def figures(self) -> dict[str, Any]:
        """p50/p99/max lag in ms over the window (None before the first sample)."""
        xs = sorted(self.samples)
        if not xs:
            return {"samples": 0, "p50Ms": None, "p99Ms": None, "maxMs": None}

        def at(q: float) -> float:
            return round(xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))] * 1000, 2)
        return {"samples": len(xs), "p50Ms": at(0.5), "p99Ms": at(0.99), "maxMs": round(xs[-1] * 1000, 2)}
