"""One agent on a node: the body of its Ray streaming task.

Yields, in order: {"kind": "started", node, name, pgid, sandbox} as soon as the CLI runs
(until then the daemon shows the agent as waiting for a node); batches of raw stdout
lines (list[bytes]); {"kind": "exit", code, workspace?, deleted?}. A CLI that cannot be
started yields {"kind": "spawn-error", detail} instead. However the task ends — the CLI
done, Ray's cancel (KeyboardInterrupt), an error — `finally` kills the group and deletes
the private dir and the record; when the worker itself is killed, the guardian kills the
group and the daemon's next boot reaps the record.

The payload is a plain dict (versioned) so a node never unpickles a daemon class: argv,
env (the caller's API key travels only here, inside the task's arguments — never in argv,
a runtime_env, or a log line), cwd, files, what to mount.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any, Iterator

from ..launch.ray_nodes import NAME_LABEL
from ..launch.sandbox import Confinement, HostLayout, inside_path, wrap
from . import state, workspace
from .guardian import Guarded

PAYLOAD_VERSION = 1


def where() -> tuple[str, str]:
    """(Ray node id, a name for people: the node's swarmbase/name label, else its host name)."""
    import ray
    ctx = ray.get_runtime_context()
    node_id = ctx.get_node_id()
    name = None
    try:
        labels = ctx.get_node_labels()
        value = labels.get(NAME_LABEL)
        name = value[0] if isinstance(value, list) and value else value
    except Exception:  # older Ray or no labels: the host name will do
        name = None
    return node_id, str(name or socket.gethostname())


def sandbox_mode(wanted: str) -> str:
    if wanted == "none":
        return "none"
    return "bwrap" if shutil.which("bwrap") else "none (bubblewrap is not installed on this node)"


class _Paths:
    """The daemon's view of paths, made the node's: AGENT_DIR becomes the private dir as
    the CLI sees it, and a shipped workspace's daemon path becomes where it was unpacked."""

    def __init__(self, placeholder: str, agent_dir: str, cwd_from: str | None, cwd_to: str) -> None:
        self.placeholder, self.agent_dir, self.cwd_from, self.cwd_to = placeholder, agent_dir, cwd_from, cwd_to

    def cwd(self, value: str) -> str:
        return value.replace(self.cwd_from, self.cwd_to) if self.cwd_from else value

    def __call__(self, value: str) -> str:
        return self.cwd(value.replace(self.placeholder, self.agent_dir))


def run_agent(payload: dict[str, Any], shipped: bytes | None = None) -> Iterator[Any]:
    if payload.get("v") != PAYLOAD_VERSION:
        raise RuntimeError(f"this node's swarmbase speaks payload v{PAYLOAD_VERSION}, the daemon sent "
                           f"v{payload.get('v')}: install the daemon's swarmbase version on the node")
    owner, boot, key = payload["owner"], payload["boot"], payload["key"]
    record, private, work = state.agent_dirs(owner, boot, key)
    node_id, name = where()
    proc: Guarded | None = None
    try:
        state.makedirs(private)
        for d in payload["dirs"]:
            state.makedirs(private / d)
        for rel, data in payload["files"].items():
            target = private / rel
            if ".." in Path(rel).parts or os.path.isabs(rel):
                raise ValueError(f"file outside the private dir: {rel!r}")
            state.makedirs(target.parent)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        cwd, before = payload["cwd"], None
        if shipped is not None:
            workspace.unpack(shipped, work)
            before = workspace.manifest(work)
            cwd = str(work)
        cli = payload["argv"][0]
        if not (os.path.isfile(cli) and os.access(cli, os.X_OK)):
            yield {"kind": "spawn-error", "detail": f"the executable is missing on node {name}: {cli}"}
            return
        mode = sandbox_mode(payload["sandbox"])
        paths = _Paths(payload["placeholder"], "", payload["cwd"] if shipped is not None else None, cwd)
        read = [paths.cwd(p) for p in payload["read"]]
        conf = Confinement(cwd=cwd, read=tuple(p for p in read if os.path.exists(p)),
                           write=tuple(paths.cwd(p) for p in payload["write"]), private=str(private),
                           network=payload["network"])
        paths.agent_dir = inside_path(conf, mode, str(private))
        argv = [paths(a) for a in payload["argv"]]
        env = {k: paths(v) for k, v in payload["env"].items()}
        mark = state.marker(owner, boot, key)
        env[state.MARKER_ENV] = mark
        command = wrap("bwrap" if mode == "bwrap" else "none", HostLayout.probe(), conf, argv)
        stdin_file = str(private / payload["stdin_file"]) if payload.get("stdin_file") else None
        try:
            proc = Guarded(command, env=env, cwd=cwd, stdin_file=stdin_file,
                           rlimits=[tuple(r) for r in payload.get("rlimits", [])])
        except OSError as e:
            yield {"kind": "spawn-error", "detail": f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")}
            return
        state.write_record(record, {"pgid": proc.pid, "startTime": state.start_time(proc.pid), "marker": mark,
                                    "workerPid": os.getpid(), "key": key, "owner": owner, "boot": boot,
                                    "at": time.time()})
        yield {"kind": "started", "node": node_id, "name": name, "pgid": proc.pid, "sandbox": mode}
        for batch in proc.lines():
            yield batch
        proc.kill()
        end: dict[str, Any] = {"kind": "exit", "code": proc.proc.returncode}
        if before is not None and payload.get("return_workspace"):
            try:
                end["workspace"], end["deleted"] = workspace.changes(work, before)
            except (OSError, workspace.WorkspaceTooLarge) as e:
                end["workspaceError"] = str(e)
        yield end
    finally:
        if proc is not None:
            proc.kill()
            state.kill_marked(state.marker(owner, boot, key))
        record.unlink(missing_ok=True)
        shutil.rmtree(private, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
