"""Determinism routes, the memory limit and the test probe on the real Node runner."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import trio

from swarmbase.script.runner import RunnerLimits, run_script

from .conftest import direct
from .script_host import Host, argv_with, run

# Each route to the clock or to randomness, as a script expression. Every one must throw.
CLOCK_ROUTES = {
    "Date prototype chain": "Object.getPrototypeOf(Date).now()",
    "Reflect.getPrototypeOf": "Reflect.getPrototypeOf(Date).now()",
    "Reflect.construct": "Reflect.construct(Date, []).getTime()",
    "constructor of a date": "new (new Date(0).constructor)().getTime()",
    "constructor.now": "new Date(0).constructor.now()",
    "prototype.constructor": "Object.getPrototypeOf(new Date(0)).constructor.now()",
    "subclass": "(class extends Date {}, new (class D extends Date {})().getTime())",
    "Date.call": "Date.call(null, 0)",
    "Date.apply": "Date.apply(null, [])",
    "now via descriptor": "Object.getOwnPropertyDescriptor(Date, 'now').value()",
    "Function realm": "Function('return Date')().now()",
    "constructor realm": "this.constructor.constructor('return new Date().getTime()')()",
    "DTF format": "new Intl.DateTimeFormat().format()",
    "DTF called": "Intl.DateTimeFormat().format()",
    "DTF format(undefined)": "new Intl.DateTimeFormat('en', { timeStyle: 'full' }).format(undefined)",
    "DTF format getter": "Object.getOwnPropertyDescriptor(Intl.DateTimeFormat.prototype, 'format')"
                         ".get.call(new Intl.DateTimeFormat())()",
    "DTF formatToParts": "new Intl.DateTimeFormat().formatToParts()",
    "DTF formatToParts.call": "Intl.DateTimeFormat.prototype.formatToParts.call(new Intl.DateTimeFormat())",
    "DTF formatRange": "new Intl.DateTimeFormat().formatRange()",
    "DTF formatRange one date": "new Intl.DateTimeFormat().formatRange(undefined, 0)",
    "DTF formatRangeToParts": "new Intl.DateTimeFormat().formatRangeToParts(0)",
    "DTF via constructor": "new (new Intl.DateTimeFormat().constructor)().format()",
    "toLocaleString of now": "new Date().toLocaleString()",
    "performance": "performance.now()",
    "globalThis.performance": "globalThis.performance.timeOrigin.toFixed()",
    "crypto": "crypto.getRandomValues(new Uint8Array(4))",
    "crypto.randomUUID": "crypto.randomUUID()",
    "Math.random": "Math.random()",
    "Math.random descriptor": "Object.getOwnPropertyDescriptor(Math, 'random').value()",
    "WeakRef": "new WeakRef({}).deref()",
    "FinalizationRegistry": "new FinalizationRegistry(() => {})",
    "WebAssembly.Memory": "new WebAssembly.Memory({ initial: 1 })",
    "timers": "setTimeout(() => {}, 0)",
}


@pytest.mark.parametrize("name", list(CLOCK_ROUTES))
async def test_every_clock_and_random_route_throws(name: str) -> None:
    out, _ = await run(f"return {CLOCK_ROUTES[name]};")
    assert not out.ok, (name, out.value)
    assert any(s in out.error for s in ("would differ when the run is resumed", "is not defined",
                                        "is not a function", "Invalid time value",
                                        "Cannot read properties of undefined")), (name, out.error)


async def test_builtin_stack_frames_do_not_hand_out_the_real_date() -> None:
    out, _ = await run("""
let fns = [];
Error.prepareStackTrace = (e, frames) => frames.map(f => f.getFunction()).filter(Boolean);
new Date({ valueOf() { fns = new Error().stack; return 0; } });
const kinds = fns.map(f => { try { return typeof f.now === 'function' ? typeof f.now() : 'no now'; }
                            catch (e) { return e.name; } });
return kinds;""")
    assert out.ok, out.error
    assert "number" not in out.value


async def test_explicit_dates_and_formats_still_work() -> None:
    out, _ = await run("""
class D extends Date {}
const f = new Intl.DateTimeFormat('en', { timeZone: 'UTC', dateStyle: 'medium' });
return [new Date(0).toISOString(), new Date('2026-01-02').getUTCDate(), Date.UTC(2020, 0, 1),
        Date.parse('2020-01-01T00:00:00Z'), new Date(5) instanceof Date, new D(7).getTime(),
        new Date(0).constructor === Date, Date.name, Date.length, f.format(0), f.format === f.format,
        f.formatToParts(0).length > 0, f.formatRange(0, 86400000 * 3), new Date(0).toLocaleDateString('en', { timeZone: 'UTC' })]""")
    assert out.ok, out.error
    assert out.value == ["1970-01-01T00:00:00.000Z", 2, 1577836800000, 1577836800000, True, 7, True, "Date", 7,
                         "Jan 1, 1970", True, True, "Jan 1\u2009–\u20094, 1970", "1/1/1970"]


async def test_typed_arrays_behave_as_before_their_guard() -> None:
    out, _ = await run("""
const a = Uint8Array.from([1, 2, 3]).map(x => x * 2);
const b = new ArrayBuffer(8).slice(2);
class Bytes extends Uint8Array {}
return [Array.from(a), a instanceof Uint8Array, a.constructor === Uint8Array, b.byteLength,
        b instanceof ArrayBuffer, new Bytes(2) instanceof Bytes, Uint8Array.BYTES_PER_ELEMENT,
        ArrayBuffer.isView(a), Array.from(a.toReversed()), Uint8Array.name, new Float64Array(a.buffer.slice(0, 0)).length,
        (() => { try { Uint8Array(2); return 'called'; } catch (e) { return e.name; } })()]""")
    assert out.ok, out.error
    assert out.value == [[2, 4, 6], True, True, 6, True, True, 1, True, [6, 4, 2], "Uint8Array", 0, "TypeError"]


MB = 1024 * 1024


async def test_arraybuffer_bomb_across_slices_hits_the_memory_limit() -> None:
    # The attack from issue 10: allocate in small steps between agent() calls so no slice
    # runs long. Touching the pages makes the memory real (resident).
    host = Host()
    out, _ = await run("""
const keep = [];
for (let i = 0; i < 200; i++) { keep.push(new Uint8Array(32 * 2 ** 20).fill(1)); await agent('tick'); }
return 'survived';""", host=host, argv=argv_with(data_limit_mb=512))
    assert not out.ok
    assert out.error == "the script exceeded its memory limit (512 MB)"
    # It stopped near 85 % of 512 MB: about 13 steps of 32 MB, well before the hard limit.
    assert 8 <= len(host.calls) <= 15


@pytest.mark.parametrize("catch", [True, False])
async def test_failed_allocation_ends_the_run_even_when_caught(catch: bool) -> None:
    # One slice, so the usage check never runs before the hard limit refuses an allocation.
    body = "const keep = []; for (;;) keep.push(new ArrayBuffer(64 * 2 ** 20));"
    script = f"try {{ {body} }} catch (e) {{ return 'caught ' + e.message; }}" if catch else body
    out, _ = await run(script, argv=argv_with(data_limit_mb=512))
    assert not out.ok
    assert out.error == "the script exceeded its memory limit (512 MB)"


@pytest.mark.parametrize("expr", [
    "new ArrayBuffer(2 ** 45)", "new Uint8Array(2 ** 32)", "new SharedArrayBuffer(2 ** 45)",
    "new Uint8Array(2 ** 29).map(x => x)",
])
async def test_any_failed_backing_store_allocation_counts(expr: str) -> None:
    out, _ = await run(f"try {{ {expr}; }} catch (e) {{ }} return 'carried on';", argv=argv_with(data_limit_mb=512))
    assert not out.ok and out.error == "the script exceeded its memory limit (512 MB)", expr


async def test_heap_exhaustion_kills_the_runner_and_says_why() -> None:
    out, _ = await run("const a = []; for (;;) a.push(new Array(1e5).fill(1.5));",
                       argv=argv_with(node_flags=["--max-old-space-size=64"]))
    assert not out.ok
    assert out.error == "the script exceeded its memory limit"


def test_memory_limit_comes_from_the_start_message() -> None:
    script = "const keep = []; for (let i = 0; i < 20; i++) { keep.push(new ArrayBuffer(16 * 2 ** 20)); await agent('t'); }"
    msgs = [{"t": "start", "script": script, "args": None, "budget": {}, "memoryLimitMb": 100}]
    msgs += [{"t": "reply", "id": i, "ok": True, "value": None} for i in range(1, 21)]
    got = direct(msgs)
    done = got[-1]
    assert done["t"] == "done" and done["error"] == "the script exceeded its memory limit (100 MB)"
    calls = [m for m in got if m["t"] == "call"]
    assert 4 <= len(calls) <= 6   # 85 % of 100 MB is passed during the fifth or sixth 16 MB buffer


def test_sync_is_answered_in_line_order_after_the_reply_it_follows() -> None:
    script = "return await race([() => agent('a'), () => agent('b')])"
    got = direct([{"t": "start", "script": script, "args": None, "budget": {}},
                  {"t": "sync", "n": 1},
                  {"t": "reply", "id": 2, "ok": True, "value": "B"},
                  {"t": "sync", "n": 2}])
    kinds = [(m["t"], m.get("n", m.get("ids"))) for m in got]
    # The reply decided the race: its cancel comes before the next synced (here the run's
    # end, then sync 2 if the runner read it before exiting).
    assert kinds[:5] == [("call", None), ("call", None), ("synced", 1), ("cancel", [1]), ("done", None)]
    assert kinds[5:] in ([], [("synced", 2)])
    assert got[3]["reason"] == "lost the race" and got[4]["value"] == "B"


PROBE = "const net = await import('node:net'); return [typeof net.connect, process.pid > 0];"
FORGED = "process.stdout.write(JSON.stringify({ t: 'done', ok: true, value: 'forged' }) + '\\n'); return 1;"


def test_probe_runs_in_the_runner_process_only_when_enabled() -> None:
    start = {"t": "start", "script": "return await agent('hold')", "args": None, "budget": {}}
    probe = {"t": "probe", "id": 1, "code": PROBE}
    got = direct([start, probe], env={"SWARMBASE_TEST_PROBE": "1"}, until=lambda m: m["t"] == "probe-result")
    assert {"t": "probe-result", "id": 1, "ok": True, "value": ["function", True]} in got
    got = direct([start, probe, {"t": "probe", "id": 2, "code": FORGED}, {"t": "sync", "n": 9},
                  {"t": "reply", "id": 1, "ok": True, "value": "real"}])
    assert [m["t"] for m in got] == ["call", "synced", "done"]
    assert got[-1]["value"] == "real"


async def probe_during_a_run(enabled: bool) -> tuple[Any, Any]:
    """Run a script that waits on an agent; meanwhile probe the runner through the bridge
    (or, when probes are off, send one that would forge the result and show it ignored)."""
    host = Host()
    host.gates["hold"] = trio.Event()
    result: list[Any] = []

    async def prober() -> None:
        await host.reached.setdefault("hold", trio.Event()).wait()
        if enabled:
            result.append(await host.bridge.probe(PROBE))
        else:
            # The sync barrier proves the probe line was read before the agent answers.
            await host.bridge.send({"t": "probe", "id": 99, "code": FORGED})
            await host.bridge.sync()
            result.append("ignored")
        host.gates["hold"].set()

    argv = argv_with(env={"SWARMBASE_TEST_PROBE": "1"}) if enabled else None
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(prober)
            out = await run_script("return await agent('hold')", None, host, RunnerLimits(), argv=argv)
    return out, result


async def test_bridge_probe_runs_code_in_the_runner_process() -> None:
    out, result = await probe_during_a_run(enabled=True)
    assert out.ok and out.value == "<hold>"
    assert result == [["function", True]]


async def test_probe_is_ignored_without_the_variable() -> None:
    out, result = await probe_during_a_run(enabled=False)
    assert out.ok and out.value == "<hold>"
    assert result == ["ignored"]


FAKE_RUNNER = r"""
import json, sys
def w(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
sys.stdin.readline()   # start
w({"t": "call", "id": 1, "op": "agent", "prompt": "slow", "opts": {}})
w({"t": "call", "id": 2, "op": "workflow", "source": {"name": 3}, "args": None, "opts": {}})
w({"t": "call", "id": 3, "op": "workflow", "source": "return 1", "args": [1], "opts": []})
w({"t": "cancel", "ids": [1, 77, "x"], "reason": "lost the race"})
got = []
for line in sys.stdin:
    m = json.loads(line)
    if m["t"] == "reply":
        got.append(m)
    if len(got) == 3:
        w({"t": "done", "ok": True, "value": sorted(got, key=lambda r: r["id"])})
        break
"""


async def test_bridge_cancel_reply_shape_and_malformed_workflow_calls() -> None:
    host = Host({"slow": 30.0})
    with trio.fail_after(30):
        out = await run_script("unused", None, host, RunnerLimits(), argv=[sys.executable, "-c", FAKE_RUNNER])
    assert out.ok, out.error
    assert out.value == [
        {"t": "reply", "id": 1, "ok": True, "value": None, "cancelled": True},
        {"t": "reply", "id": 2, "ok": False, "error": "workflow(): malformed call on the bridge"},
        {"t": "reply", "id": 3, "ok": False, "error": "workflow(): malformed call on the bridge"},
    ]
    assert host.cancelled == [(["ticket:slow"], "lost the race")]
    assert host.finished == []


async def test_sync_after_the_run_ended_returns_at_once() -> None:
    host = Host()
    out, _ = await run("return 1", host=host)
    assert out.ok
    with trio.fail_after(5):
        await host.bridge.sync()
