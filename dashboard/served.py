"""What the dashboard reads of the daemon's services (swarmbase.daemon.Services builds
them): named here so each page says what it uses, without the dashboard importing the
daemon that mounts it."""

from __future__ import annotations

from typing import Any, Protocol

import trio

from swarmbase.config import Config
from swarmbase.lag import LagProbe
from swarmbase.runs.env import RunEnv
from swarmbase.runs.supervisor import Supervisor


class RayView(Protocol):
    def view(self) -> dict[str, Any]:
        """The cluster as the nodes page shows it (launch/ray_watch.py)."""


class Served(Protocol):
    cfg: Config
    env: RunEnv
    supervisor: Supervisor
    drain: trio.Event          # set at shutdown: event streams end
    lag: LagProbe

    @property
    def ray(self) -> RayView | None: ...
