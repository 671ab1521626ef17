"""What an engine asks a launcher to run, what comes back, and what a launcher offers
(the Launcher and ProcessOpener protocols, and the placements by name).

An engine never knows where or how its process runs: it names the program, its
environment, the files it needs written into a private dir before it starts, the host
paths it must read or write, and whether it needs the network and where to (`egress`).
Values in argv and env may contain AGENT_DIR, replaced by the launcher with the private
dir as the process sees it (a fixed mount inside the sandbox, the host path without one,
a node-local path on Ray).
"""

from __future__ import annotations

import os
import subprocess
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Protocol

import attrs

from .egress import Endpoint
from .spawn import Child, Limits

if TYPE_CHECKING:
    from ..identity import SandboxUser

AGENT_DIR = "@AGENT_DIR@"
# Env values a launcher that runs a key door beside the process replaces (ModelKey).
KEY_DOOR_BEARER = "@KEY_DOOR_BEARER@"
KEY_DOOR_URL = "@KEY_DOOR_URL@"


@attrs.frozen
class ModelKey:
    """The caller's model API key, for a process placed where the daemon's key door
    (engines/key_door.py) is out of reach: its launcher runs a key door of its own beside
    the process (a Ray node: node/door.py), registers the key there under `bearer`, puts
    that bearer and the door's URL where the env says KEY_DOOR_BEARER and KEY_DOOR_URL, and
    gives the process's network a door to it. The key itself never enters the process's
    env. The daemon makes the bearer (not the node) so that its redactor knows it while
    the process lives, as it knows a local agent's."""
    key: str = attrs.field(repr=False)
    upstream: str                              # the model API's base URL (engines.claude.baseUrl, or the vendor's)
    bearer: str = attrs.field(repr=False)      # what the process holds instead of the key


@attrs.frozen
class LaunchSpec:
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str                                   # host path; the process runs there
    key: str                                   # unique per agent: "<runId>-<n>"
    files: Mapping[str, bytes] = attrs.field(factory=dict)   # relative path in the private dir -> bytes
    dirs: tuple[str, ...] = ("home", "tmp")    # made in the private dir (0700)
    stdin_file: str | None = None              # relative path in the private dir, given as stdin
    read: tuple[str, ...] = ()                 # host paths the process must be able to read
    write: tuple[str, ...] = ()                # host paths it may write (besides its private dir)
    network: bool = True
    # Launch-time checks (launch/pins.py): daemon-made dirs under the state dir this process
    # may have mounted (its run's work/, its worktree); the caller's roots, and the paths
    # (its cwd, a worktree's repository dirs) that must still resolve under them.
    state_dirs: tuple[str, ...] = ()
    cwd_roots: tuple[str, ...] = ()
    caller_paths: tuple[str, ...] = ()
    nesting: bool = False                      # the process builds a sandbox of its own (codex)
    # The caller whose child this is: a root daemon runs it as that caller's uid
    # (identity.py); None: a child of no caller (a spare runner, the self-check).
    owner: str | None = None
    overlays: Mapping[str, bytes] = attrs.field(factory=dict)  # read-only files laid over these paths
    # With network: the only host:port it may reach (launch/egress.py); None: the host's
    # whole network. Without the sandbox (sandbox "none") the process has the host's
    # network whatever this says; a Ray node makes the namespace and its doors itself.
    egress: tuple[Endpoint, ...] | None = None
    model_key: ModelKey | None = None          # a key door beside the process (off the daemon's machine)
    idle_timeout: float = 300.0
    limits: Limits = Limits()
    record: Mapping[str, Any] = attrs.field(factory=dict)    # extra fields for the process record


@attrs.define
class ProcResult:
    exit_code: int | None = None
    idle_timeout: bool = False
    final_seen: bool = False
    lines: int = 0
    spawn_error: str | None = None             # the process could not be started
    error: str | None = None                   # the launcher lost or could not place it ("node lost: ...")
    node: str | None = None                    # where it ran (None: this machine)


OnLine = Callable[[bytes], bool]               # returns True for the final event
Started = Callable[[Mapping[str, Any]], None]  # where it runs: {"pgid", "node"?}; a launcher with
                                               # initial_state "waiting-node" calls it once placed


class Launcher(Protocol):
    """What every placement offers (this machine, a Ray cluster)."""

    @property
    def initial_state(self) -> str:
        """An agent's state from when it holds its slots until its CLI starts: "running",
        or "waiting-node" (it calls `started` once placed)."""

    @property
    def confined(self) -> bool:
        """Whether its processes see only what they asked for (engines may skip deny-lists)."""

    @property
    def spawned(self) -> int:
        """Processes it started since boot (for benches and tests)."""

    @property
    def on_daemon_host(self) -> bool:
        """Whether its processes run on the daemon's machine and so reach the daemon's
        loopback relays (the key door, the meter); elsewhere an agent must hold its key."""

    async def run(self, spec: LaunchSpec, on_line: OnLine, started: Started | None = None) -> ProcResult:
        """Run until the final event, the leader's exit, or the idle watchdog; cancelling
        the caller kills the process (its whole group)."""


class LauncherBase:
    """What a launcher is unless it says otherwise: its agents are running once they hold
    their slots, its processes are not confined and run elsewhere, it has counted none."""
    initial_state = "running"
    spawned = 0
    on_daemon_host = False

    @property
    def confined(self) -> bool:
        return False


class ProcessOpener(Protocol):
    """The local launcher's other side: a process on this machine with the pipes asked
    for (a script runner, sandboxed git), its process records, and handing the daemon's
    own dirs to the user its children run as."""

    @property
    def procs(self) -> Path:
        """Where its process records are (one per live group, for the boot reaper)."""

    def user_for(self, owner: str | None) -> SandboxUser | None:
        """Who a child of `owner` (a caller's name; None: no caller) runs as (None: the
        daemon's own user)."""

    def open(self, spec: LaunchSpec, *, stdin: int | None = None, stdout: int | None = subprocess.PIPE,
             stderr: int | None = None, grace: float = 1.0) -> AbstractAsyncContextManager[Child]:
        """The process, killed as a group when the context ends."""

    def adopt(self, path: str | os.PathLike[str], owner: str | None) -> None:
        """Make a dir the daemon made for `owner`'s children theirs."""


class LocalPlacement(Launcher, ProcessOpener, Protocol):
    """This machine's launcher: a placement that also opens processes."""


class Placements(Mapping[str, Launcher]):
    """Where agents may run, by placement name; "local" is always there and is also the
    opener that runs script runners and worktree git."""

    def __init__(self, local: LocalPlacement, **others: Launcher) -> None:
        self.local = local
        self._by_name: dict[str, Launcher] = {"local": local, **others}

    def __getitem__(self, name: str) -> Launcher:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)


def substitute(value: str, agent_dir: str) -> str:
    return value.replace(AGENT_DIR, agent_dir)


def placed(spec: LaunchSpec, agent_dir: str) -> tuple[list[str], dict[str, str]]:
    """argv and env with AGENT_DIR replaced."""
    return ([substitute(a, agent_dir) for a in spec.argv],
            {k: substitute(v, agent_dir) for k, v in spec.env.items()})

