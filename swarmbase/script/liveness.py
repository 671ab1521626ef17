"""When the script runner counts as unresponsive (the bridge's second watchdog).

The runner answers pings from its event loop, but a pong is only read once the daemon
has read every line the runner wrote before it: while the runner floods the daemon with
work (a resume replaying 1,000 agents writes a call per answer it gets), the pong waits
in the pipe and the runner looked dead though it was busy doing what it was asked
(issue 33 item 2). So every line heard from the runner counts, not only pongs: a runner
writes nothing while its event loop is stuck. Script code cannot fake it: synchronous and
microtask loops are cut by the runner's slice timeout, the first watchdog.

And a daemon that itself stalled (its event loop blocked, the watchdog's sleep overshot)
has not heard the runner because it was not listening: that time is not the runner's.
Pure: the bridge passes the clock.
"""

from __future__ import annotations

import attrs


@attrs.define
class Liveness:
    timeout: float
    last_heard: float
    last_tick: float | None = None

    def heard(self, now: float) -> None:
        self.last_heard = now

    def silent_for(self, now: float, interval: float) -> float:
        """How long the runner has been silent while the daemon listened, at a watchdog
        tick meant to come `interval` after the last one."""
        if self.last_tick is not None:
            stalled = (now - self.last_tick) - interval
            if stalled > interval:            # the daemon was away: credit the runner that time
                self.last_heard = min(now, self.last_heard + stalled)
        self.last_tick = now
        return now - self.last_heard

    def expired(self, now: float, interval: float) -> bool:
        return self.silent_for(now, interval) > self.timeout
