"""The MCPL endpoint over real WebSockets: auth, handshakes, JSON-RPC faults, tools."""

from __future__ import annotations

import json

import pytest
import trio
from trio_websocket import ConnectionClosed

from swarmbase.client import RpcFailure, connect, open_websocket

from .conftest import Env


async def raw_exchange(url: str, frames: list[str], n_answers: int) -> list[dict]:
    async with open_websocket(url) as ws:
        for f in frames:
            await ws.send_message(f)
        out = []
        for _ in range(n_answers):
            out.append(json.loads(await ws.get_message()))
        return out


# -- auth --------------------------------------------------------------------

INITIALIZE = '{"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}'


@pytest.mark.parametrize("token, first, rid", [
    (None, INITIALIZE, 0), ("", INITIALIZE, 0), ("wrong-token", INITIALIZE, 0),
    ("wrong-token", '{"jsonrpc": "2.0", "method": "notifications/initialized"}', None),   # a notification too
    (None, "not json", None),
])
async def test_bad_or_missing_token_gets_32001_then_4001(running: Env, token: str | None, first: str,
                                                         rid: int | None) -> None:
    url = running.ws if token is None else f"{running.ws}?token={token}"
    with trio.fail_after(10):
        async with open_websocket(url) as ws:
            await ws.send_message(first)
            await ws.send_message(json.dumps({"jsonrpc": "2.0", "id": 7, "method": "ping"}))
            answer = json.loads(await ws.get_message())
            assert answer["id"] == rid
            assert answer["error"]["code"] == -32001
            assert answer["error"]["message"].startswith("unauthorized")
            # Answered at once, and nothing after the first frame is: the connection is closed.
            with pytest.raises(ConnectionClosed) as ei:
                await ws.get_message()
            assert ei.value.reason.code == 4001


async def test_token_selects_caller_and_its_runs(running: Env) -> None:
    with trio.fail_after(20):
        async with connect(running.ws, running.tokens["alice"]) as a:
            await a.handshake()
            run_id = (await a.tool("run", {"script": "return 1"}))["structuredContent"]["runId"]
            await a.wait_notice(f"{run_id}:end")
        async with connect(running.ws, running.tokens["bob"]) as b:
            await b.handshake()
            # Bob's token is another caller's: he sees none of Alice's runs.
            assert (await b.tool("list"))["structuredContent"]["runs"] == []
            for tool in ("status", "result", "cancel", "resume"):
                res = await b.tool(tool, {"runId": run_id})
                assert res["isError"] is True
                assert f"no run {run_id!r} for this caller" in res["content"][0]["text"]
        assert running.services.supervisor.runs[run_id].status == "completed"


# -- handshakes ------------------------------------------------------------------

async def test_handshake_mcpl_05(running: Env) -> None:
    with trio.fail_after(10):
        async with connect(running.ws, running.tokens["alice"]) as h:
            init = await h.handshake("0.5")
            caps = init["capabilities"]
            assert caps["tools"] == {}
            mcpl = caps["experimental"]["mcpl"]
            assert mcpl["version"] == "0.5" and mcpl["pushEvents"] is True
            sets = mcpl["featureSets"]
            assert isinstance(sets, dict)
            assert sets["swarmbase"]["uses"] == ["tools"]
            notify = sets["swarmbase.notify"]
            assert notify["uses"] == ["pushEvents"]
            onto = notify["tagOntology"]
            assert onto["tags"]["swarmbase:run-end"]["suggestedTreatment"] == "immediate"
            assert {"tagsAny": ["swarmbase:run-end"], "behavior": "immediate"} in onto["suggestedTreatment"]
            assert set(onto["tags"]) >= {"swarmbase:completed", "swarmbase:failed", "swarmbase:cancelled",
                                         "swarmbase:interrupted", "surface:done", "swarmbase:budget-warning"}
            warn = onto["tags"]["swarmbase:budget-warning"]
            assert warn["suggestedTreatment"] == {"debounce": 30_000} and warn["facet"] == "lifecycle"
            assert {"tagsAny": ["swarmbase:budget-warning"], "behavior": {"debounce": 30_000}} in onto["suggestedTreatment"]
            assert h.receipt == {"accepted": True, "unavailableFeatures": [], "notes": []}
            tools = (await h.request("tools/list"))["tools"]
            assert [t["name"] for t in tools] == ["run", "status", "result", "cancel", "resume", "list", "guide",
                                                   "workflows", "save_workflow", "usage"]
            assert all(t["inputSchema"]["type"] == "object" for t in tools)
            assert await h.request("ping") == {}


async def test_degraded_receipt_without_push_grant(running: Env) -> None:
    with trio.fail_after(10):
        async with connect(running.ws, running.tokens["alice"]) as h:
            await h.handshake("0.5", grant=False)
            receipt = await h.request("featureSets/update", {"effectiveCapabilities": ["tools"]})
            assert receipt["mode"] == "degraded"
            assert receipt["unavailableFeatures"] == [
                {"featureSet": "swarmbase.notify", "missingCapabilities": ["pushEvents"], "effect": "disabled"}]
            with pytest.raises(RpcFailure) as ei:
                await h.request("featureSets/update", {"effectiveCapabilities": ["tools"], "deniedCapabilities": ["tools"]})
            assert ei.value.code == -32602


async def test_handshake_pre_05_host_selects_by_notification_and_pushes(running: Env) -> None:
    with trio.fail_after(20):
        async with connect(running.ws, running.tokens["alice"]) as h:
            init = await h.handshake("0.4")
            sets = init["capabilities"]["experimental"]["mcpl"]["featureSets"]
            assert set(sets) == {"swarmbase", "swarmbase.notify"}      # object form unless known otherwise
            run_id = (await h.tool("run", {"script": "return 'old host'"}))["structuredContent"]["runId"]
            notice = await h.wait_notice(f"{run_id}:end")
            assert "swarmbase:completed" in notice["tags"]
        async with connect(running.ws, running.tokens["alice"]) as h:
            init = await h.handshake("0.4", client_name="mcpl-harness")
            sets = init["capabilities"]["experimental"]["mcpl"]["featureSets"]
            assert [s["name"] for s in sets] == ["swarmbase", "swarmbase.notify"]


async def test_plain_mcp_client_gets_tools_but_no_mcpl(running: Env) -> None:
    with trio.fail_after(10):
        async with connect(running.ws, running.tokens["alice"]) as h:
            init = await h.handshake(None)
            assert init["capabilities"] == {"tools": {}}
            assert len((await h.request("tools/list"))["tools"]) == 10
            res = await h.tool("guide", {"topic": "determinism"})
            assert "Math.random()" in res["structuredContent"]["text"]
            with pytest.raises(RpcFailure) as ei:
                await h.request("featureSets/update", {"effectiveCapabilities": ["pushEvents"]})
            assert ei.value.code == -32601


# -- JSON-RPC faults ---------------------------------------------------------------

async def test_malformed_json_unknown_method_invalid_params(running: Env) -> None:
    url = f"{running.ws}?token={running.tokens['alice']}"
    init = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"capabilities": {}}})
    with trio.fail_after(10):
        answers = await raw_exchange(url, [
            init,
            "{not json",
            json.dumps({"jsonrpc": "2.0", "id": 1, "method": "bogus/method"}),
            json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                        "params": {"name": "run", "arguments": {"script": 42}}}),
            json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                        "params": {"name": "status", "arguments": {"runId": "run_000000000000", "extra": 1}}}),
            json.dumps({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "nope"}}),
            json.dumps({"jsonrpc": "1.0", "id": 5, "method": "ping"}),
            json.dumps({"jsonrpc": "2.0", "id": 6, "method": "ping"}),
        ], 8)
    by_id = {a.get("id"): a for a in answers}
    assert by_id[0]["result"]["serverInfo"]["name"] == "swarmbase"
    assert by_id[None]["error"]["code"] == -32700
    assert by_id[1]["error"]["code"] == -32601
    assert by_id[2]["error"]["code"] == -32602
    assert by_id[2]["error"]["data"]["path"] == "arguments.script"
    assert "arguments.script" in by_id[2]["error"]["message"]
    assert by_id[3]["error"]["code"] == -32602 and "extra" in by_id[3]["error"]["message"]
    assert by_id[4]["error"]["code"] == -32602 and "unknown tool 'nope'" in by_id[4]["error"]["message"]
    assert by_id[5]["error"]["code"] == -32600
    assert by_id[6]["result"] == {}


async def test_tools_need_initialize_first(running: Env) -> None:
    url = f"{running.ws}?token={running.tokens['alice']}"
    with trio.fail_after(10):
        [a] = await raw_exchange(url, [json.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/list"})], 1)
    assert a["error"]["code"] == -32600 and "initialize" in a["error"]["message"]


async def test_http_get_on_ws_path_is_426_and_healthz(running: Env) -> None:
    import httpx
    async with httpx.AsyncClient() as c:
        r = await c.get(running.url + "/mcpl")
        assert r.status_code == 426
        assert (await c.get(running.url + "/healthz")).status_code == 200


async def test_sessions_of_one_caller_coexist_up_to_the_cap(running: Env) -> None:
    # Issue 32.15: a second connection of the caller no longer closes the first; only the
    # ninth closes the oldest (32.5: with the reason the client prints).
    from contextlib import AsyncExitStack

    from swarmbase.mcpl.session import MAX_SESSIONS_PER_CALLER
    with trio.fail_after(20):
        async with AsyncExitStack() as stack:
            hosts = [await stack.enter_async_context(connect(running.ws, running.tokens["alice"]))
                     for _ in range(MAX_SESSIONS_PER_CALLER)]
            for h in hosts:
                await h.handshake()
            for h in hosts:
                assert await h.request("ping") == {}
            assert not any(h.closed_event.is_set() for h in hosts)
            newest = await stack.enter_async_context(connect(running.ws, running.tokens["alice"]))
            await newest.handshake()
            await hosts[0].closed_event.wait()
            assert hosts[0].closed is not None
            assert (hosts[0].closed.reason.code, hosts[0].closed.reason.reason) == (
                4000, "replaced: caller alice has more than 8 sessions open; the oldest is closed")
            for h in hosts[1:] + [newest]:
                assert await h.request("ping") == {}


# -- tools: good and bad params ---------------------------------------------------

async def test_each_tool_good_and_bad(running: Env) -> None:
    with trio.fail_after(30):
        async with connect(running.ws, running.tokens["alice"]) as h:
            await h.handshake()
            big = "x" * 50_000
            res = await h.tool("run", {"script": "return args.big", "args": {"big": big}, "label": "paged",
                                       "budgetUsd": 2, "profile": "think", "effort": "low", "model": "m"})
            run_id = res["structuredContent"]["runId"]
            assert json.loads(res["content"][0]["text"]) == {"runId": run_id, "url": f"{running.url}/runs/{run_id}"}
            await h.wait_notice(f"{run_id}:end")

            st = (await h.tool("status", {"runId": run_id}))["structuredContent"]
            assert st["status"] == "completed" and st["label"] == "paged" and st["budgetUsd"] == 2
            assert st["profile"] == "think" and st["phases"] == [] and isinstance(st["log"], list)

            text, offset = "", 0
            while offset is not None:
                page = (await h.tool("result", {"runId": run_id, "offset": offset, "limit": 20_000}))["structuredContent"]
                text += page["text"]
                offset = page["nextOffset"]
            assert json.loads(text) == big

            listed = (await h.tool("list", {"status": "completed"}))["structuredContent"]["runs"]
            assert [r["runId"] for r in listed] == [run_id]
            done = (await h.tool("cancel", {"runId": run_id}))["structuredContent"]
            assert done["status"] == "completed" and "already ended" in done["note"]
            g = await h.tool("guide")
            for word in ("parallel(", "pipeline(", "profile", "budget", "Date.now()", "schema"):
                assert word in g["content"][0]["text"]

            bad = [("run", {}), ("run", {"script": ""}), ("run", {"script": "1", "profile": "root"}),
                   ("run", {"script": "1", "budgetUsd": -1}), ("status", {"runId": "nope"}),
                   ("result", {"runId": run_id, "offset": -1}), ("cancel", {}),
                   ("list", {"limit": 0}), ("guide", {"topic": "everything"})]
            for name, args in bad:
                with pytest.raises(RpcFailure) as ei:
                    await h.tool(name, args)
                assert ei.value.code == -32602, (name, args)
                assert ei.value.error["data"]["path"].startswith("arguments"), (name, args)


async def test_policy_refusals_are_tool_errors(running: Env) -> None:
    with trio.fail_after(20):
        async with connect(running.ws, running.tokens["alice"]) as h:
            await h.handshake()
            over = await h.tool("run", {"script": "return 1", "budgetUsd": 26})
            assert over["isError"] and "above this caller's runUsdMax 25" in over["content"][0]["text"]
            prof = await h.tool("run", {"script": "return 1", "profile": "write"})
            assert prof["isError"] and "maxProfile 'read'" in prof["content"][0]["text"]
            # maxActiveRuns is 3: three runs parked on agent() calls that never finish.
            ids = []
            for _ in range(3):
                r = await h.tool("run", {"script": "await agent('wait'); return 1"})
                ids.append(r["structuredContent"]["runId"])
            fourth = await h.tool("run", {"script": "return 1"})
            assert fourth["isError"] and "maxActiveRuns is 3" in fourth["content"][0]["text"]
            for rid in ids:
                await h.tool("cancel", {"runId": rid})
            for rid in ids:
                n = await h.wait_notice(f"{rid}:end")
                assert "swarmbase:cancelled" in n["tags"]
            res = await h.tool("result", {"runId": ids[0]})
            assert res["isError"] and "without a return value" in res["content"][0]["text"]


@pytest.fixture
async def running(env: Env, nursery: trio.Nursery):  # noqa: F811 - parked agents for policy tests
    from swarmbase.script.runner import RunnerLimits

    from .conftest import start_daemon

    from .fakes.agents import Parked

    await start_daemon(nursery, env, agents=Parked(), limits=RunnerLimits(slice_ms=1000))
    yield env
