"""What a node gives one agent: exactly the confinement a local agent gets from the
daemon's LocalLauncher, or a refusal that says why the node cannot (never a weaker
sandbox in silence).

The payload (launch/ray.py builds it) carries what the node cannot know by itself: the
uid the daemon allocated to the agent's caller (identity.py: the same allocation, and so
the same uid, as that caller's local agents), the caller's key (and the agent's bearer) for the key door
the node runs beside the agent (launch/spec.ModelKey; the agent's door to its model API leads
there), the other host:ports its doors may reach (a write agent's `network`,
launch/egress.py), and whether the CLI builds a sandbox of its own (the seccomp profile). A root node drops to that uid before the sandbox, exactly as a root daemon
does; a node that is not root runs agents as its own user, as a daemon that is not root
does, and refuses a uid it cannot switch to (one it already is, a shared `sandboxUser`
that is the node's Ray user, is no switch). Pure functions: the node's facts are
passed in (agent.py reads them).
"""

from __future__ import annotations

from typing import Any, Mapping

from ..identity import SandboxUser
from ..launch.egress import Endpoint
from ..launch.sandbox import HostLayout
from ..launch.spec import ModelKey


def user_of(payload: Mapping[str, Any]) -> SandboxUser | None:
    """The caller's uid as the daemon allocated it (None: the daemon runs agents as its own user)."""
    u = payload.get("user")
    return SandboxUser(uid=int(u["uid"]), gid=int(u["gid"]), name=str(u["name"])) if u else None


def egress_of(payload: Mapping[str, Any]) -> tuple[Endpoint, ...] | None:
    """Where the agent's door may lead (None: the node's whole network, as for a local agent without a list)."""
    e = payload.get("egress")
    return None if e is None else tuple(Endpoint(str(host), int(port)) for host, port in e)


def model_key_of(payload: Mapping[str, Any]) -> ModelKey | None:
    """The caller's key and model API, and the bearer the daemon made for the agent, for
    the key door the node runs beside it."""
    k = payload.get("keyDoor")
    return None if k is None else ModelKey(key=str(k["key"]), upstream=str(k["upstream"]), bearer=str(k["bearer"]))


def payload_user(user: SandboxUser | None) -> dict[str, Any] | None:
    """The daemon's half of user_of."""
    return None if user is None else {"uid": user.uid, "gid": user.gid, "name": user.name}


def payload_egress(egress: tuple[Endpoint, ...] | None) -> list[list[Any]] | None:
    """The daemon's half of egress_of."""
    return None if egress is None else [[ep.host, ep.port] for ep in egress]


def payload_model_key(model_key: ModelKey | None) -> dict[str, str] | None:
    """The daemon's half of model_key_of."""
    return None if model_key is None else {"key": model_key.key, "upstream": model_key.upstream,
                                            "bearer": model_key.bearer}


def refusal(wanted: str, layout: HostLayout, euid: int, user: SandboxUser | None, node: str) -> str | None:
    """Why this node cannot give the agent the sandbox the daemon gives its own (None: it can)."""
    if wanted == "none":
        return None
    if not layout.bwrap:
        return (f"node {node} cannot run the agent in the sandbox: bubblewrap is not installed there "
                "(apt-get install bubblewrap); the daemon runs every agent in it (sandbox \"bwrap\")")
    if euid == 0 and user is None:
        return (f"node {node}'s Ray runs as root and the daemon named no uid for the agent (a daemon that is "
                "not root runs agents as its own user): the agent would run as root in its namespace. Run the "
                "daemon as root too (each caller then has a uid of its own on every node), or the node's Ray as "
                "a plain user")
    if euid != 0 and user is not None and user.uid != euid:
        return (f"the daemon runs this caller's agents as uid {user.uid}, and node {node}'s Ray runs as uid "
                f"{euid}, which cannot switch to it: run the node's Ray as root (agents then drop to the caller's "
                "uid, as on the daemon's machine)")
    if user is not None and not layout.setpriv:
        return f"node {node} cannot drop to the caller's uid: setpriv (util-linux) is not installed there"
    return None
