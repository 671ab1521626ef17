"""The real Node script runner: hooks, determinism guards, escapes, watchdogs."""

from __future__ import annotations

import pytest
import trio

from typing import Any

from swarmbase.script.runner import AgentCallError, RunnerLimits, run_script

from .script_host import Host, run


async def test_every_hook() -> None:
    script = """export const meta = { name: "all hooks", description: "uses everything" };
phase("one");
log("start", { n: args.n });
console.log("via console");
console.warn("careful");
const first = await agent("a", { label: "first" });
const par = await parallel([() => agent("p1"), () => agent("p2"), () => 7]);
const piped = await pipeline([1, 2, 3], (x, item, i) => x * 10 + i, async (y, item) => agent("stage-" + y + "-" + item));
phase("two");
const nul = await agent("null-one");
return { first, par, piped, nul, meta, b: { total: budget.total, spent: budget.spent(), infinite: budget.remaining() === Infinity,
         usd: { total: budget.usd.total, spent: budget.usd.spent, remaining: budget.usd.remaining, reserved: budget.usd.reserved },
         codex: budget.codex }, args };
"""
    out, host = await run(script, {"n": 3})
    assert out.ok, out.error
    assert out.value["first"] == "<a>"
    assert out.value["par"] == ["<p1>", "<p2>", 7]
    # Claude Code's stage arguments: (previous result, original item, index).
    assert out.value["piped"] == ["<stage-10-1>", "<stage-21-2>", "<stage-32-3>"]
    assert out.value["nul"] is None
    # Claude Code's budget shape (no token target: total null, remaining() Infinity; spent()
    # counts output tokens) beside SwarmBase's USD view.
    assert out.value["b"] == {"total": None, "spent": 60, "infinite": True,
                              "usd": {"total": 5.0, "spent": 1.5, "remaining": 3.5, "reserved": 0.0}, "codex": None}
    assert out.value["args"] == {"n": 3}
    # meta is a const of the script (the daemon has already read it as a literal).
    assert out.value["meta"] == {"name": "all hooks", "description": "uses everything"}
    assert host.phases == ["one", "two"]
    assert host.logs == ['start {"n":3}', "via console", "[warn] careful"]
    assert host.calls[0] == ("a", {"label": "first"})


async def test_parallel_results_in_input_order_whatever_finishes_first() -> None:
    delays = {f"t{i}": (9 - i) * 0.01 for i in range(10)}
    out, host = await run("return await parallel(args.map(p => () => agent(p)))", list(delays), Host(delays))
    assert out.ok and out.value == [f"<t{i}>" for i in range(10)]
    assert host.max_live == 10


async def test_pipeline_overlaps_stages_across_items() -> None:
    # Item 0's slow first stage must not hold item 1 back from reaching stage two.
    delays = {"s1-0": 0.3, "s1-1": 0.0, "s2-1": 0.0, "s2-0": 0.0}
    script = """
const order = [];
const res = await pipeline([0, 1],
  async (i) => { await agent("s1-" + i); order.push("s1-" + i); return i; },
  async (i) => { await agent("s2-" + i); order.push("s2-" + i); return i * 2; });
return { res, order };"""
    out, _ = await run(script, None, Host(delays))
    assert out.ok, out.error
    assert out.value["res"] == [0, 2]
    assert out.value["order"].index("s2-1") < out.value["order"].index("s1-0")


async def test_parallel_and_pipeline_turn_throws_into_null_and_go_on() -> None:
    # Claude Code's rule: a thunk or stage that throws becomes null (and a log line), the
    # call itself never rejects, and every sibling still runs to its end.
    delays = {"slow": 0.2}
    script = """
const par = await parallel([() => agent("slow"), () => agent("throw-1"), () => { throw new TypeError("own bug"); }]);
const piped = await pipeline(["a", "throw-2", "c"], (p) => agent(p), (r, item, i) => r + ":" + item + ":" + i);
return { par, piped };"""
    out, host = await run(script, None, Host(delays))
    assert out.ok, out.error
    assert out.value == {"par": ["<slow>", None, None], "piped": ["<a>:a:0", None, "<c>:c:2"]}
    assert sorted(c[0] for c in host.calls) == ["a", "c", "slow", "throw-1", "throw-2"]
    assert host.logs == ["parallel[1] failed: budget exhausted at throw-1", "parallel[2] failed: own bug",
                         "pipeline[1] failed: budget exhausted at throw-2"]


async def test_parallel_and_pipeline_refuse_to_start_past_the_agent_cap_or_token_target() -> None:
    # The stops of the whole run propagate: parallel()/pipeline() check them before they
    # start anything, with Claude Code's error names.
    host = Host()
    host.max_agents = 0
    script = """
const out = {};
for (const [name, call] of [["p", () => parallel([() => agent("x")])], ["q", () => pipeline([1], (v) => agent("y"))]]) {
  try { await call(); out[name] = "ran"; } catch (e) { out[name] = e.name + ": " + e.message; }
}
return out;"""
    out, host = await run(script, None, host)
    assert out.ok, out.error
    cap = "WorkflowAgentCapError: agent(): this run reached its cap of 0 agents (maxAgentsPerRun in the daemon config lifts it)"
    assert out.value == {"p": cap, "q": cap}
    assert host.calls == []
    spent = Host()
    spent.token_target, spent.output_tokens = 100, 100
    out, spent = await run(script, None, spent)
    assert out.value["p"].startswith("WorkflowBudgetExceededError: agent(): the run's token target is spent (100 of 100")
    assert spent.calls == []


async def test_budget_stops_inside_parallel_are_dropped_silently() -> None:
    class BudgetHost(Host):
        async def agent(self, prompt: str, opts: dict[str, Any], ticket: Any = None) -> Any:
            if prompt == "over":
                raise AgentCallError("agent(): the run's budget is spent", kind="budget")
            return await super().agent(prompt, opts, ticket)
    out, host = await run("return await parallel([() => agent('over'), () => agent('fine')]);", None, BudgetHost())
    assert out.ok and out.value == [None, "<fine>"]
    assert host.logs == []


async def test_agent_throw_fails_run_with_message_and_line() -> None:
    out, _ = await run("const x = 1;\nawait agent('throw-now');\nreturn x;")
    assert not out.ok
    assert out.error == "Error: budget exhausted at throw-now"
    assert out.line == 2


async def test_script_error_message_and_line() -> None:
    out, _ = await run("const a = 1;\n\nnull.boom;")
    assert not out.ok and out.line == 3
    assert out.error.startswith("TypeError: Cannot read properties of null")
    out, _ = await run("return (1 +;")
    assert not out.ok and out.error.startswith("SyntaxError")
    out, _ = await run("import fs from 'fs';\nreturn 1")
    assert not out.ok and "import is not available" in out.error
    out, _ = await run("throw 'plain string'")
    assert not out.ok and "non-error value: plain string" in out.error


@pytest.mark.parametrize("expr,what", [
    ("Date.now()", "Date.now()"),
    ("new Date()", "new Date() without arguments"),
    ("Date()", "Date() (the current time as text)"),
    ("Math.random()", "Math.random()"),
])
async def test_determinism_guards(expr: str, what: str) -> None:
    out, _ = await run(f"return {expr};")
    assert not out.ok
    assert what in out.error and "would differ when the run is resumed" in out.error


async def test_dates_with_arguments_still_work() -> None:
    out, _ = await run("return [new Date(0).toISOString(), new Date('2026-01-02').getUTCDate(), "
                       "Date.UTC(2020, 0, 1), new Date(5) instanceof Date]")
    assert out.ok and out.value == ["1970-01-01T00:00:00.000Z", 2, 1577836800000, True]


# Each escape: the script, and what a contained run returns (ok value) or fails with.
ESCAPES = {
    "constructor": ("return this.constructor.constructor('return process')().pid",
                    "ReferenceError: process is not defined"),
    "agent.constructor": ("return agent.constructor('return process')().pid",
                          "ReferenceError: process is not defined"),
    "hook constructor chain": ("return log.constructor.constructor('return process.env')()",
                               "ReferenceError: process is not defined"),
    "callee.caller": ("function f() { return arguments.callee.caller; } const c = f(); "
                      "let up; try { up = c.caller === null ? 'null' : typeof c.caller; } catch (e) { up = e.name; } "
                      "return [await c.constructor('return typeof process')(), up].join(',')",
                      lambda v: v in ("undefined,null", "undefined,TypeError")),
    "prepareStackTrace": ("Error.prepareStackTrace = (e, frames) => frames.map(f => f.getThis()); "
                          "const found = []; for (const t of new Error().stack) { if (!t) continue; "
                          "try { found.push(typeof t.constructor.constructor('return process')()); } "
                          "catch (e) { found.push(e.name); } } return found.join(',');",
                          lambda v: set(v.split(",")) <= {"undefined", "ReferenceError", ""}),
    "error from hook": ("try { await agent('throw-x'); } catch (e) { return e.constructor.constructor('return typeof process')() }",
                        "undefined"),
    "promise from hook": ("const p = agent('a'); return p.constructor.constructor('return typeof process')()",
                          "undefined"),
    "proxy opts": ("let leak = 'not called'; const trap = new Proxy({}, { get(t, k) { if (k === 'toJSON') "
                   "return () => { leak = typeof process; return {}; }; return undefined; } }); "
                   "await agent('a', trap); return leak", "undefined"),
    "getter on reply": ("const r = await agent('a'); return Object.getPrototypeOf(r).constructor.constructor"
                        "('return typeof process')()", "undefined"),
    "globals": ("return [typeof require, typeof process, typeof fetch, typeof setTimeout, typeof queueMicrotask,"
                " typeof globalThis.__sbBody, typeof module].join(',')",
                "undefined,undefined,undefined,undefined,undefined,undefined,undefined"),
    "import()": ("const m = await import('node:fs'); return typeof m.readFileSync", "TypeError"),
    "overwrite hooks": ("globalThis.agent = 1; try { Object.defineProperty(globalThis, 'agent', {value: 2}); } "
                        "catch (e) { return [typeof agent, e.name].join(','); }", "function,TypeError"),
}


@pytest.mark.parametrize("name", list(ESCAPES))
async def test_escape_attempts_fail(name: str) -> None:
    script, expected = ESCAPES[name]
    out, _ = await run(script)
    if callable(expected):
        assert out.ok and expected(out.value), (name, out)
    elif out.ok:
        assert out.value == expected, (name, out)
    else:
        assert expected in out.error, (name, out)


async def test_busy_loop_sync_hits_watchdog() -> None:
    out, _ = await run("let i = 0; while (true) { i++; }", slice_ms=200)
    assert not out.ok and out.watchdog
    assert "watchdog" in out.error and "200 ms" in out.error


async def test_busy_loop_in_microtasks_hits_watchdog() -> None:
    out, _ = await run("await agent('a'); const spin = () => Promise.resolve().then(spin); spin(); "
                       "await new Promise(() => {});", slice_ms=200)
    assert not out.ok and out.watchdog


async def test_promise_that_cannot_settle_fails_fast() -> None:
    out, _ = await run("await new Promise(() => {}); return 1")
    assert not out.ok and "nothing can settle" in out.error


async def test_unknown_return_values_become_json() -> None:
    out, _ = await run("return { f: () => 1, u: undefined, n: null, big: 'x'.repeat(100000).length }")
    assert out.ok and out.value == {"n": None, "big": 100000}
    out, _ = await run("const a = {}; a.self = a; return a")
    assert not out.ok and "circular" in out.error.lower()


async def test_unresponsive_runner_is_killed_by_ping_watchdog() -> None:
    # A fake "runner" that never answers pings stands in for a wedged event loop.
    host = Host()
    argv = ["python3", "-c", "import time\nwhile True: time.sleep(1)"]
    with trio.fail_after(20):
        out = await run_script("return 1", None, host, RunnerLimits(ping_interval=0.2, pong_timeout=1.0), argv=argv)
    assert not out.ok and out.watchdog and "did not answer" in out.error


async def test_a_runner_busy_writing_is_not_taken_for_a_dead_one() -> None:
    # A stand-in for a runner replaying a flood of answers: it writes a line every 0.2 s but
    # its pongs would sit behind them, so it never pongs at all. Its lines prove it lives.
    host = Host()
    busy = ("import json, sys, time\nsys.stdin.readline()\n"
            "for i in range(40):\n"
            "    print(json.dumps({'t': 'log', 'message': f'busy {i}'}), flush=True); time.sleep(0.2)\n"
            "print(json.dumps({'t': 'done', 'ok': True, 'value': 'finished'}), flush=True)\n"
            "time.sleep(30)\n")
    with trio.fail_after(40):
        out = await run_script("return 1", None, host, RunnerLimits(ping_interval=0.2, pong_timeout=5.0),
                               argv=["python3", "-c", busy])
    assert out.ok and out.value == "finished", out.error            # 8 s of lines, never a pong
    assert len([m for m in host.logs if m.startswith("busy")]) == 40


def test_liveness_counts_only_the_time_the_daemon_listened() -> None:
    from swarmbase.script.liveness import Liveness
    live = Liveness(timeout=10, last_heard=0)
    assert [live.expired(t, 2) for t in (2, 4, 6, 8, 10, 12)] == [False] * 5 + [True]   # ticking every 2 s
    live = Liveness(timeout=10, last_heard=0)
    assert not live.expired(2, 2)
    assert not live.expired(20, 2)          # the daemon stalled 16 s: that silence is not the runner's
    assert [live.expired(t, 2) for t in (22, 24, 26, 28)] == [False, False, False, True]
    live.heard(28)
    assert not live.expired(30, 2)


async def test_runner_permission_model_denies_fs_and_children() -> None:
    # Even code that ran in the runner's own realm could not write or spawn: check the
    # flags the daemon starts node with.
    import subprocess

    from swarmbase.script.runner import RUNNER_ENV, node_argv
    argv = node_argv()[:-1] + ["-e", (
        "const fs=require('fs');const cp=require('child_process');const r=[];"
        "try{fs.writeFileSync('/tmp/sb-escape','x');r.push('write')}catch(e){r.push(e.code)}"
        "try{cp.execSync('true');r.push('child')}catch(e){r.push(e.code)}"
        "try{fs.readFileSync('/etc/hostname');r.push('read')}catch(e){r.push(e.code)}"
        "try{new (require('worker_threads').Worker)('1',{eval:true});r.push('worker')}catch(e){r.push(e.code)}"
        "console.log(r.join(','), Object.keys(process.env).sort().join(','))")]
    out = subprocess.run(argv, env=RUNNER_ENV, capture_output=True, text=True, timeout=20)
    verdicts, envkeys = out.stdout.split()
    assert verdicts == "ERR_ACCESS_DENIED,ERR_ACCESS_DENIED,ERR_ACCESS_DENIED,ERR_ACCESS_DENIED"
    assert envkeys == "LANG,TZ"


async def test_runner_crash_is_explained_from_its_stderr() -> None:
    argv = ["python3", "-c", "import sys; sys.stderr.write('node: bad option --experimental-permission\\n'); sys.exit(9)"]
    with trio.fail_after(20):
        out = await run_script("return 1", None, Host(), RunnerLimits(), argv=argv)
    assert not out.ok
    assert out.error == "the script runner exited unexpectedly: node: bad option --experimental-permission"
