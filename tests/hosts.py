"""In-test MCPL hosts that behave as real host builds do (see docs/decisions.md, "featureSets
form per host", for the sources each behaviour is taken from)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import trio

from swarmbase.client import HostClient, RpcFailure


class AgentFrameworkLike:
    """agent-framework's 2026-03 build: advertises MCPL "0.4" and clientInfo.name
    "agent-framework", types `featureSets` as an object and spreads it (so an array
    declares sets "0" and "1"), selects sets with a featureSets/update Notification, and
    answers a push for a set it does not know `{accepted:false, reason:"Unknown feature
    set: <name>"}`; a repeated eventId is a duplicate."""

    def __init__(self) -> None:
        self.sets: dict[str, Any] = {}
        self.attempts: Counter[str] = Counter()
        self._accepted: set[str] = set()

    def declare(self, init_result: dict[str, Any]) -> None:
        declared = init_result["capabilities"]["experimental"]["mcpl"]["featureSets"]
        # `{...declared}` in TypeScript: an array spreads into its indices.
        self.sets = {str(i): v for i, v in enumerate(declared)} if isinstance(declared, list) else dict(declared)

    def answer(self, params: dict[str, Any]) -> dict[str, Any]:
        eid = params["eventId"]
        self.attempts[eid] += 1
        if params["featureSet"] not in self.sets:
            return {"result": {"accepted": False, "reason": f"Unknown feature set: {params['featureSet']}"}}
        if eid in self._accepted:
            return {"result": {"accepted": False, "reason": "duplicate"}}
        self._accepted.add(eid)
        return {"result": {"accepted": True, "inferenceId": f"swarmbase-{len(self._accepted)}-x"}}

    async def handshake(self, h: HostClient) -> dict[str, Any]:
        init = await h.request("initialize", {
            "protocolVersion": "2024-11-05",
            "capabilities": {"experimental": {"mcpl": {"version": "0.4", "pushEvents": True,
                                                       "contextHooks": {"beforeInference": True}}}},
            "clientInfo": {"name": "agent-framework", "version": "1.0.0"}})
        self.declare(init)
        await h.notify("notifications/initialized")
        await h.notify("featureSets/update", {"enabled": ["swarmbase", "swarmbase.notify"], "disabled": []})
        return init


class HarnessCrashed(Exception):
    pass


class HarnessLike:
    """mcpl-harness 0.1.x (web session): advertises "0.4", iterates `featureSets` with
    `for (const fs of decls ?? [])` (a TypeError on the object form, which kills the
    session), never sends featureSets/update, calls channels/list after tools/list and
    tolerates an error, and answers every push with a bare `{accepted: true}`."""

    def __init__(self, client_name: str = "mcpl-harness-web") -> None:
        self.client_name = client_name
        self.attempts: Counter[str] = Counter()

    def answer(self, params: dict[str, Any]) -> dict[str, Any]:
        self.attempts[params["eventId"]] += 1
        return {"result": {"accepted": True}}

    async def handshake(self, h: HostClient) -> dict[str, Any]:
        init = await h.request("initialize", {
            "protocolVersion": "2024-11-05",
            "capabilities": {"experimental": {"mcpl": {"version": "0.4", "pushEvents": True, "channels": True,
                                                       "modelInfo": True, "scopedAccess": True}}},
            "clientInfo": {"name": self.client_name, "version": "0.1.0"}})
        declared = init["capabilities"]["experimental"]["mcpl"].get("featureSets")
        if declared is not None and not isinstance(declared, list):
            await h.ws.aclose()
            raise HarnessCrashed("TypeError: (decls ?? []) is not iterable")
        await h.notify("notifications/initialized", {})
        await h.request("tools/list", {})
        try:
            await h.request("channels/list", {})
        except RpcFailure:
            pass
        return init


AF_V05_BRANCHES = "anima-research/agent-framework feature/mcpl-v05-state-branches @ 1d0fd23"


def af_wildcard_match(pattern: str, name: str) -> bool:
    """`wildcardMatch` of src/mcpl/feature-set-manager.ts (1d0fd23): segments split on
    '.', `*` matches exactly one segment, the counts must be equal."""
    p, n = pattern.split("."), name.split(".")
    return len(p) == len(n) and all(a == "*" or a == b for a, b in zip(p, n))


class AgentFrameworkV05Branches:
    """The host of AF_V05_BRANCHES, message for message. Its `performHandshake`
    (src/mcpl/server-connection.ts) sends `initialize` as id 0 with the host capabilities of
    src/framework.ts (`version: '0.5'`, pushEvents, contextHooks, stateUpdate, featureSets,
    branches), then `notifications/initialized` without params. framework.ts then sends the
    selection that `FeatureSetManager.initializeServer` computes from the server entry's
    `enabledFeatureSets` (every declared set not enabled is listed as disabled) through
    `sendFeatureSetsUpdate`, which is a *notification*; it never sends a featureSets/update
    request. Its own requests count from 1. `PushHandler.handlePushEvent` answers a push for
    a set the manager does not have enabled `{accepted:false, reason:"Feature set not
    enabled: …"}` (or "Unknown feature set: …"), a repeated eventId `{accepted:false,
    reason:"duplicate"}`, else `{accepted:true, inferenceId:"<serverId>-<ms>-<rand>"}`.
    Frames are `JSON.stringify` output: compact, keys in the order the source writes them."""

    HOST_CAPABILITIES = {"version": "0.5", "pushEvents": True,
                         "contextHooks": {"beforeInference": True, "afterInference": {"blocking": True}},
                         "stateUpdate": True, "featureSets": True,
                         "branches": {"list": True, "create": True, "switch": True, "delete": True}}

    def __init__(self, enabled_feature_sets: list[str], server_id: str = "swarmbase") -> None:
        self.enabled_patterns = enabled_feature_sets
        self.server_id = server_id
        self.declared: dict[str, Any] = {}
        self.enabled: set[str] = set()
        self.attempts: Counter[str] = Counter()
        self._seen: set[str] = set()
        self._next_id = 1
        self.sent: list[str] = []          # every frame this host sent, as sent

    async def _send(self, h: HostClient, msg: dict[str, Any]) -> None:
        text = json.dumps(msg, separators=(",", ":"))
        self.sent.append(text)
        await h.ws.send_message(text)

    async def _request(self, h: HostClient, msg: dict[str, Any]) -> dict[str, Any]:
        send, recv = trio.open_memory_channel[dict[str, Any]](1)
        h._waiting[msg["id"]] = send      # the client's reader hands the answer over
        await self._send(h, msg)
        resp = await recv.receive()
        if "error" in resp:
            raise RpcFailure(resp["error"])
        return resp["result"]

    def selection(self) -> dict[str, Any]:
        """`initializeServer`'s update params for the declared sets."""
        names = list(self.declared)
        self.enabled = {n for n in names if any(af_wildcard_match(p, n) for p in self.enabled_patterns)}
        params: dict[str, Any] = {}
        enabled = [n for n in names if n in self.enabled]
        disabled = [n for n in names if n not in self.enabled]
        if enabled:
            params["enabled"] = enabled
        if disabled:
            params["disabled"] = disabled
        return params

    async def handshake(self, h: HostClient) -> dict[str, Any]:
        init = await self._request(h, {"jsonrpc": "2.0", "method": "initialize", "id": 0, "params": {
            "protocolVersion": "2024-11-05", "capabilities": {"experimental": {"mcpl": self.HOST_CAPABILITIES}},
            "clientInfo": {"name": "agent-framework", "version": "1.0.0"}}})
        await self._send(h, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        mcpl = init.get("capabilities", {}).get("experimental", {}).get("mcpl")
        if mcpl is not None:
            self.declared = dict(mcpl.get("featureSets") or {})      # `{ ...declared }`
            params = self.selection()
            if params.get("enabled") or params.get("disabled"):
                await self._send(h, {"jsonrpc": "2.0", "method": "featureSets/update", "params": params})
        return init

    async def tool(self, h: HostClient, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        rid, self._next_id = self._next_id, self._next_id + 1
        return await self._request(h, {"jsonrpc": "2.0", "method": "tools/call", "id": rid,
                                       "params": {"name": name, "arguments": arguments}})

    def answer(self, params: dict[str, Any]) -> dict[str, Any]:
        eid = params["eventId"]
        self.attempts[eid] += 1
        fs = params["featureSet"]
        if fs not in self.declared:
            return {"result": {"accepted": False, "reason": f"Unknown feature set: {fs}"}}
        if fs not in self.enabled:
            return {"result": {"accepted": False, "reason": f"Feature set not enabled: {fs}"}}
        if eid in self._seen:
            return {"result": {"accepted": False, "reason": "duplicate"}}
        self._seen.add(eid)
        return {"result": {"accepted": True, "inferenceId": f"{self.server_id}-{len(self._seen)}-x"}}
