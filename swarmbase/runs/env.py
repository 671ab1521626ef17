"""What the pieces of a run use from the daemon, handed down as one frozen value.

A run's pieces (its LiveRun, the agent service, the script host, boot, the flush) used to
receive the Supervisor and pick what they needed from it, which made runs/ one import
circle and every helper need the whole daemon in its head. Now the daemon builds the
services once (config, store, events, redactor, observers, outbox, links, what a full disk
keeps), hands them down in a RunEnv, and builds the Supervisor last, over them: nothing
below the Supervisor imports it.
"""

from __future__ import annotations

import attrs

from ..config import Config
from ..events import EventHub
from ..notify.outbox import Outbox
from .deferred import Deferred
from .model import Run
from .observers import Observers
from .records import Redactor
from .store import RunStore


@attrs.define
class Links:
    """Links handed to callers: publicUrl when configured; the daemon replaces the default
    with its bound loopback URL once it listens."""
    base: str

    @classmethod
    def for_config(cls, cfg: Config) -> Links:
        return cls(cfg.publicUrl.rstrip("/") if cfg.publicUrl else f"http://127.0.0.1:{cfg.port}")

    def run(self, run_id: str) -> str:
        return f"{self.base.rstrip('/')}/runs/{run_id}"


@attrs.define
class ConfigSlot:
    """The daemon's current Config. The one mutable thing a RunEnv holds: a reload
    (live_reload.swap) puts the new Config here in one step, and every piece that reads
    `env.cfg` sees it from its next read on."""
    current: Config


@attrs.frozen
class RunEnv:
    slot: ConfigSlot = attrs.field(alias="cfg", converter=ConfigSlot)
    store: RunStore
    outbox: Outbox
    events: EventHub = attrs.Factory(EventHub)
    redact: Redactor = attrs.Factory(Redactor)
    observers: Observers = attrs.Factory(Observers)
    links: Links = attrs.field(default=attrs.Factory(lambda self: Links.for_config(self.cfg), takes_self=True))
    # What a full disk kept in memory: journal lines (paid results), written when space returns.
    deferred: Deferred = attrs.field(default=attrs.Factory(lambda self: Deferred(self.cfg.state_dir),
                                                           takes_self=True))

    @property
    def cfg(self) -> Config:
        return self.slot.current

    def use_config(self, new: Config) -> None:
        """A reload's swap (live_reload.py)."""
        self.slot.current = new

    def keeps_work(self, run: Run) -> bool:
        """Whether an ended run's work dir stays (keepWork, or deleteWorkOnEnd off)."""
        return run.keep_work or not self.cfg.deleteWorkOnEnd
