"""race, waitN, bounded and workflow on the real Node runner, with a Python host.

A "slow" agent sleeps 30 s: a test that finishes (each has a 30 s fail_after) shows it
was cancelled rather than waited for. Cancels are checked on the host's side
(calls_cancelled) and by what never reached the host.
"""

from __future__ import annotations

import pytest

from swarmbase.script.host import ScriptHostBase

from .script_host import Host, run

SLOW = 30.0


async def test_race_fast_beats_slow_and_slow_is_cancelled() -> None:
    host = Host({"slow": SLOW, "fast": 0.05})
    out, _ = await run("return await race([() => agent('slow'), () => agent('fast')])", host=host)
    assert out.ok, out.error
    assert out.value == "<fast>"
    assert host.cancelled == [(["ticket:slow"], "lost the race")]
    assert host.finished == ["fast"]


async def test_race_failed_first_finisher_cannot_win() -> None:
    host = Host({"null-quick": 0.0, "ok-later": 0.5})
    out, _ = await run("return await race([() => agent('null-quick'), () => agent('ok-later')])", host=host)
    assert out.ok and out.value == "<ok-later>"
    assert host.cancelled == []


async def test_race_without_winner() -> None:
    out, host = await run("return await race([() => agent('null-a'), () => agent('null-b'), () => null])")
    assert out.ok and out.value is None
    assert host.cancelled == []
    # A branch that throws cannot win either; with no winner the first failure is thrown.
    out, _ = await run("""
try { await race([() => agent('null-a'), () => agent('throw-b'), async () => { throw new Error('own') }]); }
catch (e) { return e.message }""")
    assert out.ok and out.value == "budget exhausted at throw-b (race: 2 of 3 failed, none won)"
    out, _ = await run("return await race([])")
    assert out.ok and out.value is None


async def test_nested_races_cancel_their_own_losers_and_descendants() -> None:
    # Inner race: a2 beats a1. Outer race: the inner winner beats b.
    host = Host({"a1": SLOW, "a2": 0.05, "b": SLOW})
    out, _ = await run("""
return await race([
  () => race([() => agent('a1'), () => agent('a2')]),
  () => agent('b'),
]);""", host=host)
    assert out.ok and out.value == "<a2>"
    assert host.cancelled_prompts() == ["a1", "b"]
    # The outer race is won by a plain agent: both agents of the inner race (a descendant
    # of the losing branch) are cancelled in one go.
    host = Host({"x1": SLOW, "x2": SLOW, "fast": 0.05})
    out, _ = await run("""
return await race([
  () => race([() => agent('x1'), () => agent('x2')]),
  () => agent('fast'),
]);""", host=host)
    assert out.ok and out.value == "<fast>"
    assert host.cancelled == [(["ticket:x1", "ticket:x2"], "lost the race")]


async def test_losing_branch_never_reaches_the_daemon_again() -> None:
    # The loser awaits one agent (cancelled: it resolves null), then calls another, which
    # must resolve null at once without reaching the host. Code after `await loserDone`
    # belongs to the root again: its agent() call works.
    host = Host({"slow": SLOW, "fast": 0.05})
    out, _ = await run("""
const seen = [];
let loserDone = null;
const r = await race([
  () => (loserDone = (async () => { seen.push(await agent('slow')); seen.push(await agent('after-loss'));
                                     return 'loser'; })()),
  () => agent('fast'),
]);
seen.push(await loserDone);
seen.push(await agent('root-again'));
return { r, seen };""", host=host)
    assert out.ok, out.error
    assert out.value == {"r": "<fast>", "seen": [None, None, "loser", "<root-again>"]}
    assert host.begun == ["slow", "fast", "root-again"]
    assert sorted(p for p, _ in host.calls) == ["fast", "root-again", "slow"]
    assert host.cancelled_prompts() == ["slow"]


async def test_branch_attribution_survives_local_awaits_and_helpers() -> None:
    # Calls made after `await null`, inside parallel() and inside bounded() in a losing
    # branch all belong to that branch and are cancelled with it.
    host = Host({"p1": SLOW, "p2": SLOW, "late": SLOW, "b0": SLOW, "b1": SLOW, "fast": 0.1})
    out, _ = await run("""
return await race([
  async () => { await null; await Promise.resolve(); return agent('late'); },
  () => parallel([() => agent('p1'), () => agent('p2')]),
  () => bounded(2, ['b0', 'b1', 'b2', 'b3'], (p) => agent(p)),
  () => agent('fast'),
]);""", host=host)
    assert out.ok and out.value == "<fast>"
    assert host.cancelled_prompts() == ["b0", "b1", "late", "p1", "p2"]
    assert "b2" not in host.begun and "b3" not in host.begun


async def test_branches_decided_before_they_start_never_run() -> None:
    out, host = await run("return await race([() => 'now', async () => { await null; return agent('never'); }])")
    assert out.ok and out.value == "now"
    assert host.begun == []


async def test_replayed_winner_cancels_losers_before_they_spawn() -> None:
    # On resume the winner is answered at once (Answered from agent_begin); the host makes
    # every other call settle() first, as the daemon does, so losers never spawn. w2 is
    # only asked for after w1's replayed answer arrives: settle must wait for it too.
    host = Host({"loser": SLOW}, replayed={"w1": "<w1>", "w2": "<w2>"}, settle_before_spawn=True)
    out, _ = await run("""
return await race([
  () => agent('loser'),
  async () => { await agent('w1'); return agent('w2'); },
]);""", host=host)
    assert out.ok and out.value == "<w2>"
    assert host.begun == ["loser", "w1", "w2"]
    assert host.spawned == []
    assert host.cancelled == [(["ticket:loser"], "lost the race")]


async def test_waitN_takes_the_first_n_in_completion_order() -> None:
    delays = {"t0": SLOW, "t1": 1.2, "t2": 0.0, "t3": SLOW, "t4": 0.5}
    host = Host(delays)
    out, _ = await run("return await waitN(2, ['t0', 't1', 't2', 't3', 't4'].map(p => () => agent(p)))", host=host)
    assert out.ok and out.value == ["<t2>", "<t4>"]
    assert host.cancelled_prompts() == ["t0", "t1", "t3"]
    assert host.cancelled[0][1] == "waitN had its 2 results"


async def test_waitN_throws_as_soon_as_fewer_than_n_can_succeed() -> None:
    host = Host({"ok-a": 0.0, "null-b": 0.3, "null-c": 0.6, "slow-d": SLOW, "slow-e": SLOW})
    out, _ = await run("""
try { return await waitN(4, ['ok-a', 'null-b', 'null-c', 'slow-d', 'slow-e'].map(p => () => agent(p))); }
catch (e) { return { message: e.message, values: e.values }; }""", host=host)
    assert out.ok, out.error
    assert out.value == {"message": "waitN(4): only 1 of 5 succeeded, 4 needed (2 failed or returned null, "
                                    "2 still running were cancelled)", "values": ["<ok-a>"]}
    assert host.cancelled_prompts() == ["slow-d", "slow-e"]


@pytest.mark.parametrize("expr,message", [
    ("waitN(3, [() => 1, () => 2])", "waitN(3, thunks): only 2 thunks, so 3 can never succeed"),
    ("waitN(-1, [])", "waitN(n, thunks): n must be a non-negative integer"),
    ("waitN(1, [() => agent('throw-x'), () => null])",
     "waitN(1): only 0 of 2 succeeded, 1 needed (2 failed or returned null); first error: budget exhausted at throw-x"),
    ("race('x')", "race(thunks): thunks must be an array of functions"),
    ("bounded(0, [], x => x)", "bounded(limit, items, fn): limit must be a positive integer"),
    ("bounded(2, [1], 'f')", "bounded(limit, items, fn): fn must be a function"),
])
async def test_bad_calls_throw_catchable_errors(expr: str, message: str) -> None:
    out, _ = await run(f"try {{ await {expr}; return 'no throw'; }} catch (e) {{ return e.message; }}")
    assert out.ok and out.value == message
    out, _ = await run("return await waitN(0, [() => agent('never')])")
    assert out.ok and out.value == []


async def test_bounded_keeps_the_limit_and_input_order() -> None:
    # Later items are faster, so completion order is far from input order.
    delays = {f"i{k}": 0.02 * (20 - k) for k in range(20)}
    host = Host(delays)
    out, _ = await run("return await bounded(3, args, (p, i) => agent(p).then(v => [i, v]))", list(delays), host)
    assert out.ok, out.error
    assert out.value == [[k, f"<i{k}>"] for k in range(20)]
    assert host.max_live == 3
    assert len(host.calls) == 20


async def test_bounded_stops_starting_after_a_failure() -> None:
    host = Host({"i0": 0.6, "throw-1": 0.0})
    out, _ = await run("""
try { await bounded(2, ['i0', 'throw-1', 'i2', 'i3'], (p) => agent(p)); }
catch (e) { return e.message }""", host=host)
    assert out.ok and out.value == "budget exhausted at throw-1 (bounded: 1 of 4 failed, 2 not started)"
    assert sorted(host.begun) == ["i0", "throw-1"]
    assert host.finished == ["i0"]


async def test_workflow_calls_reach_the_host_with_their_shapes() -> None:
    out, host = await run("""
const a = await workflow("return args.n * 2", { n: 21 }, { label: "double", budgetUsd: 1 });
const b = await workflow({ name: "triage" });
let c;
try { await workflow({ name: "throw-me" }); } catch (e) { c = e.message; }
return { a, b, c };""")
    assert out.ok, out.error
    assert out.value == {"a": {"ran": "return args.n * 2", "args": {"n": 21}},
                         "b": {"ran": "triage", "args": None}, "c": "workflow refused: throw-me"}
    assert host.workflows[0] == ("return args.n * 2", {"n": 21}, {"label": "double", "budgetUsd": 1}, "wf-ticket:0")
    assert host.workflows[1][0] == {"name": "triage"}


@pytest.mark.parametrize("expr", [
    "workflow('')", "workflow(42)", "workflow({ name: 'x', extra: 1 })", "workflow({})",
    "workflow('return 1', { f() {} }.f)", "workflow('return 1', null, 'fast')",
])
async def test_workflow_bad_shapes_throw_in_the_script(expr: str) -> None:
    out, host = await run(f"try {{ await {expr}; return 'no throw'; }} catch (e) {{ return e.name; }}")
    assert out.ok and out.value == "TypeError", expr
    assert host.workflows == []


async def test_workflow_in_a_losing_branch_is_cancelled() -> None:
    host = Host({"child": SLOW, "fast": 0.05})
    out, _ = await run("return await race([() => workflow({ name: 'child' }), () => agent('fast')])", host=host)
    assert out.ok and out.value == "<fast>"
    assert host.cancelled == [(["wf-ticket:0"], "lost the race")]


async def test_workflow_without_host_support_throws() -> None:
    class AgentsOnly(Host):
        workflow = ScriptHostBase.workflow      # what a host without nested workflows does

    out, _ = await run("try { await workflow('return 1'); } catch (e) { return e.message }", host=AgentsOnly())
    assert out.ok and out.value == "workflow() is not available in this daemon"


def guide_examples() -> list[str]:
    """The ```js blocks of the guide's sections on these hooks and on determinism."""
    import re

    from swarmbase import guide
    text = guide.text("hooks") + guide.text("determinism")
    return re.findall(r"```js\n(.*?)```", text, re.DOTALL)


@pytest.mark.parametrize("index", range(len(guide_examples())))
async def test_guide_examples_run(index: int) -> None:
    args = {"question": "q?", "reviewers": ["r1", "r2", "r3", "r4", "r5"], "path": "x.diff",
            "files": ["a.py", "b.py", "c.py"], "repo": "/r", "today": "2026-03-01"}
    out, host = await run(guide_examples()[index], args)
    assert out.ok, out.error
    assert host.calls or host.workflows or index == len(guide_examples()) - 1


async def test_races_starting_races_forever_hit_the_watchdog() -> None:
    # Every branch start is a short evaluation of its own; together they are one slice.
    out, _ = await run("const f = () => race([f, f]); return await f();", slice_ms=300)
    assert not out.ok and out.watchdog
    assert "300 ms without yielding" in out.error


async def test_many_large_replayed_answers_do_not_wedge_the_pipes() -> None:
    # Replayed answers are written while the bridge is still reading the runner's calls;
    # both directions carry far more than a pipe buffer holds.
    prompts = [f"p{i:03d}-" + "x" * 4000 for i in range(200)]
    host = Host(replayed={p: "y" * 4000 for p in prompts})
    out, _ = await run("const r = await parallel(args.map(p => () => agent(p))); return r.join('').length", prompts, host)
    assert out.ok, out.error
    assert out.value == 200 * 4000
