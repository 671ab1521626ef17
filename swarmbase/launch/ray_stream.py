"""Bridging one Ray streaming task into Trio, and stopping it.

A reader thread walks the task's ObjectRefGenerator (`next` blocks) and hands each item
to Trio through an unbounded memory channel: a CLI writes at human speed and the consumer
(the transcript, the meter) keeps up. The thread runs under the launcher's own
CapacityLimiter, sized to the agent cap: Trio's default limiter (40 threads) would
silently stall the 41st agent's stream.

Stopping: Ray's ordinary cancel raises KeyboardInterrupt in the task, whose `finally`
kills the CLI's group (the node polls every 0.2 s, so this lands fast); if the task has
not ended CANCEL_GRACE_S later, a force cancel kills the Ray worker and the node's
guardian ends the group; `forced` tells the launcher to follow up with a task that
forgets the agent on its node (what left the group, the record, the private dir). The
reader thread ends when the task does; only if Ray itself stops answering is it abandoned.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import attrs
import trio

log = logging.getLogger("swarmbase.launch.ray")

CANCEL_GRACE_S = 3.0
FORCE_WAIT_S = 5.0


@attrs.frozen
class Ended:
    """The task's stream is over: `error` is Ray's exception when it failed."""
    error: BaseException | None = None


class TaskStream:
    def __init__(self, ray: Any, gen: Any, limiter: trio.CapacityLimiter) -> None:
        self.ray = ray
        self.gen = gen
        self.limiter = limiter
        self.send, self.items = trio.open_memory_channel[Any](math.inf)
        self.done = trio.Event()              # the reader thread returned
        self._scope = trio.CancelScope(shield=True)
        self.cancelled = False
        self.forced = False                   # a force cancel was sent: the task's finally may not have run

    def _read_all(self, token: trio.lowlevel.TrioToken) -> None:
        def put(item: Any) -> bool:
            try:
                trio.from_thread.run_sync(self.send.send_nowait, item, trio_token=token)
                return True
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.RunFinishedError):
                return False

        try:
            for ref in self.gen:
                if not put(self.ray.get(ref)):
                    return
            put(Ended())
        except Exception as e:  # Ray's failures (cancelled, node died, task error) end the stream
            put(Ended(e))

    async def reader(self) -> None:
        """Run in the agent's nursery. Shielded: a cancelled agent still waits (briefly,
        see stop) for its task to end, so nothing of it outlives the agent unseen."""
        token = trio.lowlevel.current_trio_token()
        try:
            with self._scope:
                await trio.to_thread.run_sync(self._read_all, token, limiter=self.limiter, abandon_on_cancel=True)
        finally:
            self.done.set()

    async def _cancel(self, force: bool) -> None:
        try:
            await trio.to_thread.run_sync(lambda: self.ray.cancel(self.gen, force=force))
        except Exception as e:  # already finished, or Ray is gone: nothing left to stop
            log.debug("ray.cancel(force=%s): %r", force, e)

    async def stop(self, ended_normally: bool) -> None:
        """End the task, however far it got. Call shielded."""
        if self.done.is_set():
            return
        if ended_normally:                  # the CLI exited: the task is returning by itself
            with trio.move_on_after(CANCEL_GRACE_S):
                await self.done.wait()
            if self.done.is_set():
                return
        self.cancelled = True
        await self._cancel(force=False)
        with trio.move_on_after(CANCEL_GRACE_S):
            await self.done.wait()
        if self.done.is_set():
            return
        log.warning("an agent's Ray task ignored cancel for %.0f s: force-cancelling it", CANCEL_GRACE_S)
        self.forced = True
        await self._cancel(force=True)
        with trio.move_on_after(FORCE_WAIT_S):
            await self.done.wait()
        if not self.done.is_set():
            log.error("Ray did not end an agent's task after a force cancel; abandoning its reader thread")
            self._scope.cancel()
        self.send.close()
