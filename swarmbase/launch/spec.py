"""What an engine asks a launcher to run, and what comes back. Pure data.

An engine never knows where or how its process runs: it names the program, its
environment, the files it needs written into a private dir before it starts, the host
paths it must read or write, and whether it needs the network and where to (`egress`).
Values in argv and env may contain AGENT_DIR, replaced by the launcher with the private
dir as the process sees it (a fixed mount inside the sandbox, the host path without one,
a node-local path on Ray).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol

import attrs

from .spawn import Limits
from .egress import Endpoint

AGENT_DIR = "@AGENT_DIR@"


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
    overlays: Mapping[str, bytes] = attrs.field(factory=dict)  # read-only files laid over these paths
    # With network: the only host:port it may reach (launch/egress.py); None: the host's
    # whole network. A launcher without network namespaces (a Ray node, sandbox "none")
    # gives the host's network whatever this says.
    egress: tuple[Endpoint, ...] | None = None
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
    async def run(self, spec: LaunchSpec, on_line: OnLine, started: Started | None = None) -> ProcResult: ...


def substitute(value: str, agent_dir: str) -> str:
    return value.replace(AGENT_DIR, agent_dir)


def placed(spec: LaunchSpec, agent_dir: str) -> tuple[list[str], dict[str, str]]:
    """argv and env with AGENT_DIR replaced."""
    return ([substitute(a, agent_dir) for a in spec.argv],
            {k: substitute(v, agent_dir) for k, v in spec.env.items()})

