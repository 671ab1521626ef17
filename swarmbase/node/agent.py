"""One agent on a node: the body of its Ray streaming task.

Yields, in order: {"kind": "started", node, name, pgid, sandbox} as soon as the CLI runs
(until then the daemon shows the agent as waiting for a node); batches of raw stdout
lines (list[bytes]); {"kind": "exit", code, workspace?, deleted?}. A CLI that cannot be
started yields {"kind": "spawn-error", detail} instead. However the task ends — the CLI
done, Ray's cancel (KeyboardInterrupt), an error — `finally` kills the group and deletes
the private dir and the record; when the worker itself is killed, the guardian kills the
group and the daemon's next boot reaps the record.

The payload is a plain dict (versioned) so a node never unpickles a daemon class: argv,
env, cwd, files, what to mount, and what the sandbox needs from the daemon
(node/confine.py), the caller's API key among it: that travels only inside the task's
arguments, to the key door this node runs for the agent (node/door.py) — never into the
CLI's env, argv, files, a runtime_env, or a log line. The CLI gets what a local agent
gets, from the same pieces: the caller's uid (a root node drops to it), the seccomp
filter, no capability, no new privileges, a bearer of its own for its key door (made by the
daemon, whose redactor knows it while the agent lives), and a
network namespace whose door to the model API (the daemon's relay, on the node) leads to
that key door; a node that cannot give all of it refuses the agent and says why.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from contextlib import ExitStack, nullcontext
from pathlib import Path
from typing import Any, Iterator

import attrs

from .. import identity, seccomp
from ..launch import pins
from ..launch.egress import Endpoint, url_endpoint
from ..launch.netns import Namespace, thread_can_unshare
from ..launch.ray_nodes import NAME_LABEL
from ..launch.sandbox import Confinement, HostLayout, inside_path, wrap
from ..launch.spec import KEY_DOOR_BEARER, KEY_DOOR_URL
from . import confine, state, workspace
from .door import NodeDoor
from .guardian import Guarded

# v2: the caller's uid, the door's destinations and the seccomp profile (node/confine.py).
# v3: the caller's key for the node's key door ("keyDoor"), no longer in the env.
# v4: the agent's bearer, made by the daemon (its redactor knows it), in "keyDoor".
PAYLOAD_VERSION = 4


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
    layout, user = HostLayout.probe(), confine.user_of(payload)
    why = confine.refusal(payload["sandbox"], layout, os.geteuid(), user, name)
    if why is not None:
        yield {"kind": "spawn-error", "detail": why}
        return
    if os.geteuid() != 0:
        user = None                    # a plain node already is the uid it may run agents as
    mode = "none" if payload["sandbox"] == "none" else "bwrap"
    proc: Guarded | None = None
    with ExitStack() as held:          # what the CLI's start needs open: filter, namespace, door
        try:
            _write_private(private, payload)
            cwd, before = payload["cwd"], None
            if shipped is not None:
                workspace.unpack(shipped, work)
                before = workspace.manifest(work)
                cwd = str(work)
            if mode == "bwrap":
                # The dirs made for the agent become its uid's (identity.py), as a local agent's.
                identity.adopt_tree(user, private)
                if shipped is not None:
                    identity.adopt_tree(user, work)
            try:
                proc = _start(payload, held, layout, user, mode, private, cwd, work if shipped is not None else None,
                              name)
            except _Refused as e:
                yield {"kind": "spawn-error", "detail": str(e)}
                return
            mark = state.marker(owner, boot, key)
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
            held.close()               # the door drains once the group is dead
            record.unlink(missing_ok=True)
            shutil.rmtree(private, ignore_errors=True)
            shutil.rmtree(work, ignore_errors=True)


class _Refused(Exception):
    """The CLI cannot be started here; the message says why (the daemon shows it)."""


def _start(payload: dict[str, Any], held: ExitStack, layout: HostLayout, user: identity.SandboxUser | None,
           mode: str, private: Path, cwd: str, work: Path | None, name: str) -> Guarded:
    """The CLI, started under the guardian in its sandbox (what must stay open while it
    runs is left in `held`); _Refused if it cannot be."""
    cli = payload["argv"][0]
    if not (os.path.isfile(cli) and os.access(cli, os.X_OK)):
        raise _Refused(f"the executable is missing on node {name}: {cli}")
    paths = _Paths(payload["placeholder"], "", payload["cwd"] if work is not None else None, cwd)
    try:
        pinned = _pin(payload, paths, cwd, private, work)
    except OSError as e:           # LaunchRefused (a swapped path), or one that is gone
        raise _Refused(str(e)) from None
    held.callback(pinned.close)
    conf = Confinement(cwd=cwd, read=tuple(pinned.read), write=tuple(pinned.write), private=str(private),
                       network=payload["network"], fds=dict(pinned.fds) if mode == "bwrap" else {})
    door = held.enter_context(NodeDoor(payload["key"]))
    model_key = confine.model_key_of(payload)
    given: dict[str, str] = {}     # the env's key door placeholders, as this node's key door fills them
    to_key_door: Endpoint | None = None
    if model_key is not None:      # the caller's key stays in this process, with the agent's key door
        url, bearer = door.key_door(model_key)
        given, to_key_door = {KEY_DOOR_URL: url, KEY_DOOR_BEARER: bearer}, url_endpoint(url)
    ns: Namespace | None = None
    if mode == "bwrap":
        try:
            conf, ns = _sandbox(held, payload, conf, user, to_key_door)
        except seccomp.SeccompUnavailable as e:
            raise _Refused(f"node {name} cannot build the sandbox's seccomp filter: {e}") from None
    paths.agent_dir = inside_path(conf, mode, str(private))
    env = {k: given.get(v) or paths(v) for k, v in payload["env"].items()}
    env[state.MARKER_ENV] = state.marker(payload["owner"], payload["boot"], payload["key"])
    command = wrap(mode, layout, conf, [paths(a) for a in payload["argv"]])
    stdin_file = str(private / payload["stdin_file"]) if payload.get("stdin_file") else None
    if ns is not None:
        door.relay(ns)
    try:
        proc = Guarded(ns.argv(command) if ns else command, env=env, cwd=cwd, stdin_file=stdin_file,
                       rlimits=[tuple(r) for r in payload.get("rlimits", [])],
                       pass_fds=tuple(dict.fromkeys((*conf.passed_fds(), *(ns.pass_fds if ns else ())))),
                       around_fork=ns.around_fork if ns else nullcontext)
    except OSError as e:
        raise _Refused(f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")) from None
    held.callback(proc.kill)       # before the door drains (LIFO), whatever happens next
    try:
        door.spawned()
    except OSError as e:           # the helper could not make the namespace
        raise _Refused(str(e)) from None
    return proc


def _sandbox(held: ExitStack, payload: dict[str, Any], conf: Confinement, user: identity.SandboxUser | None,
             key_door: Endpoint | None) -> tuple[Confinement, Namespace | None]:
    """What LocalLauncher.confinement and .open add to a local agent's sandbox: the
    caller's uid, the seccomp filter, and the namespace with the agent's doors, the first
    to its key door if it has one (None: the node's network, as the daemon gives an agent
    without an egress list). What must stay open until the CLI ends is left in `held`."""
    profile = "nesting" if payload.get("nesting") else "strict"
    conf = attrs.evolve(conf, nesting=profile == "nesting", user=user,
                        seccomp_fd=_closing(held, seccomp.program_fd(profile)))
    egress = confine.egress_of(payload)
    if egress is not None and key_door is not None:
        egress = tuple(dict.fromkeys((key_door, *egress)))
    if not (payload["network"] and egress is not None):
        return conf, None
    ns = Namespace(egress, _netns_kind())
    held.callback(ns.close)
    return attrs.evolve(conf, hosts_fd=ns.hosts_fd), ns


def _pin(payload: dict[str, Any], paths: "_Paths", cwd: str, private: Path, work: Path | None) -> pins.Pinned:
    """The agent's paths pinned and checked right before it starts, as LocalLauncher._pin
    does (launch/pins.py): a dir of a shared root swapped for a symlink meanwhile (to this
    node's state, the daemon's, the Ray token) is refused, and bwrap binds the fds. What
    no agent may see here: this node's state dir, the daemon's dirs (one machine may be
    both) and the cluster token; a shipped workspace is the one dir of the node's state
    it may have."""
    token = os.environ.get("RAY_AUTH_TOKEN_PATH")
    forbidden = [os.path.realpath(p) for p in (str(state.node_dir()), *payload.get("forbidden", ()), *([token] if token else ()))]
    read = [paths.cwd(p) for p in payload["read"]]
    return pins.pin(key=payload["key"], cwd=cwd, read=[p for p in read if os.path.exists(p)],
                    write=[paths.cwd(p) for p in payload["write"]], private=str(private), forbidden=forbidden,
                    state_dirs=[str(work)] if work is not None else [], cwd_roots=payload.get("cwd_roots", ()),
                    caller_paths=[paths.cwd(p) for p in payload.get("caller_paths", ())])


def _write_private(private: Path, payload: dict[str, Any]) -> None:
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


def _closing(held: ExitStack, fd: int) -> int:
    held.callback(os.close, fd)
    return fd


_kind: str | None = None


def _netns_kind() -> str:
    """How this node makes agents' namespaces (launch/netns.py): "thread" where the task's
    thread may (a root node; the fork is born in it), else the helper. Found out once."""
    global _kind
    if _kind is None:
        _kind = "thread" if thread_can_unshare() else "helper"
    return _kind
