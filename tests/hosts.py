"""In-test MCPL hosts that behave as real host builds do (see docs/decisions.md, "featureSets
form per host", for the sources each behaviour is taken from)."""

from __future__ import annotations

from collections import Counter
from typing import Any

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
