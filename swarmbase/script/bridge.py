"""The JSON-lines bridge between the daemon and one script runner (sandbox/runner.mjs):
the script's hooks become calls to a ScriptHost, its answers go back, two watchdogs
(the runner's slice timeout, and pings answered from the runner's event loop), the
sync/settle barrier, cancels of calls the script no longer wants, and a test-only probe.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from .. import json_depth
from ..launch.procs import LineReader
from ..launch.spawn import Child
from .host import AgentCallError, Answered, ProbeError, RunnerLimits, ScriptHost, ScriptOutcome
from .liveness import Liveness

MAX_LOG_CHARS = 4000
# A message wraps the script's value in one level of its own ({"t": "call", "opts": …}).
MESSAGE_DEPTH = json_depth.MAX_DEPTH + 1
TOO_DEEP = (f"the script runner sent a value nested deeper than {json_depth.MAX_DEPTH} levels "
            "(the limit for values crossing to the daemon)")
# What a runner killed by its memory limit leaves on stderr (V8 heap limit, a failed
# backing-store allocation that escaped, or V8's fatal allocation failure).
OOM_MARKERS = (b"heap out of memory", b"Array buffer allocation failed", b"Allocation failed")
MEMORY_ERROR = "the script exceeded its memory limit"

log = logging.getLogger(__name__)


@attrs.define
class _Call:
    """A bridge call being answered: its task runs inside `scope`, so a cancel from the
    script (race/waitN losers) stops just that call."""
    scope: trio.CancelScope
    ticket: Any


@attrs.define
class _Waiter:
    """A daemon-to-runner request waiting for its answer (sync, probe)."""
    event: trio.Event = attrs.Factory(trio.Event)
    answer: dict[str, Any] | None = None


def _dumps(msg: Any) -> str:
    try:
        return json.dumps(msg, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return json.dumps(_finite(msg), ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _valid_source(source: Any) -> bool:
    return isinstance(source, str) or (
        isinstance(source, dict) and len(source) == 1 and
        any(isinstance(source.get(k), str) for k in ("name", "scriptPath")))


class _Bridge:
    def __init__(self, proc: Child, host: ScriptHost, limits: RunnerLimits) -> None:
        self.proc = proc
        self.host = host
        self.limits = limits
        # What is to go to the runner, written by write_loop in order: whatever piled up
        # while a write was under way goes as one write (a resume's 1,000 replayed answers),
        # and the reader never waits on a write (a runner blocked writing its own lines to a
        # full pipe while the daemon waited to write to it would hang both).
        self.outgoing: list[bytes] = []
        self.outgoing_ready = trio.Event()
        self.write_failed = False
        self.last_budget: Any = None      # the budget the runner was last sent
        self.outcome: ScriptOutcome | None = None
        self.liveness = Liveness(limits.pong_timeout, trio.current_time())
        self.done = trio.Event()
        self.stderr_tail = b""
        self.stderr_done = trio.Event()
        self.out_of_memory = False
        self.calls: dict[int, _Call] = {}
        self.answered_inline = 0
        self.waiters: dict[int, _Waiter] = {}
        self.last_request = 0
        host.attach(self)

    async def send(self, *msgs: dict[str, Any]) -> None:
        """Queue messages together, so no other message falls between them; raises
        BrokenResourceError once a write to the runner failed. Non-finite numbers (which
        JSON cannot carry and the runner would refuse) become null."""
        if self.write_failed:
            raise trio.BrokenResourceError("the script runner's stdin is closed")
        self.outgoing.append("".join(_dumps(m) + "\n" for m in msgs).encode())
        self.outgoing_ready.set()

    async def write_loop(self) -> None:
        assert self.proc.stdin is not None
        while True:
            await self.outgoing_ready.wait()
            self.outgoing_ready = trio.Event()
            data, self.outgoing = b"".join(self.outgoing), []
            try:
                await self.proc.stdin.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.write_failed = True      # the runner is gone; read_loop reports why
                return

    def finish(self, outcome: ScriptOutcome) -> None:
        if self.outcome is None:
            self.outcome = outcome
        self.done.set()
        for waiter in self.waiters.values():
            waiter.event.set()

    async def send_reply(self, reply: dict[str, Any]) -> None:
        """The reply, after the budget when it changed since the runner was last told
        (each budget line costs the runner an evaluation; a replay changes nothing)."""
        budget = self.host.budget_view()
        try:
            if budget == self.last_budget:
                await self.send(reply)
            else:
                await self.send({"t": "budget", "budget": budget}, reply)
                self.last_budget = budget
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the runner is gone; read_loop reports why

    def parse_call(self, msg: dict[str, Any]) -> tuple[str, Callable[[], Any], Callable[[Any], Awaitable[Any]]] | str:
        """(op, begin, work) for a well-formed call, else the error the script gets."""
        op = msg.get("op")
        if op == "agent":
            prompt, opts = msg.get("prompt", ""), msg.get("opts", {})
            if not isinstance(prompt, str) or not isinstance(opts, dict):
                return "agent(): malformed call on the bridge"
            return ("agent", lambda: self.host.agent_begin(prompt, dict(opts)),
                    lambda ticket: self.host.agent(prompt, dict(opts), ticket))
        if op == "workflow":
            source, args, opts = msg.get("source"), msg.get("args"), msg.get("opts", {})
            if not _valid_source(source) or not isinstance(opts, dict):
                return "workflow(): malformed call on the bridge"
            return ("workflow", lambda: self.host.workflow_begin(source, args, dict(opts)),
                    lambda ticket: self.host.workflow(source, args, dict(opts), ticket))
        return f"unknown bridge call {op!r}"

    async def begin_call(self, msg: dict[str, Any], nursery: trio.Nursery) -> None:
        call_id = msg["id"]
        parsed = self.parse_call(msg)
        if isinstance(parsed, str):
            await self.send({"t": "reply", "id": call_id, "ok": False, "error": parsed})
            return
        op, begin, work = parsed
        try:
            ticket = begin()
        except Exception as e:  # never let one call take the bridge down
            await self.send({"t": "reply", "id": call_id, "ok": False, "error": f"{op}(): {e}"})
            return
        if isinstance(ticket, Answered):
            self.answered_inline += 1
            await self.send_reply({"t": "reply", "id": call_id, "ok": True, "value": ticket.value})
            return
        call = _Call(trio.CancelScope(), ticket)
        self.calls[call_id] = call
        nursery.start_soon(self.answer, call_id, call, work)

    async def answer(self, call_id: int, call: _Call, work: Callable[[Any], Awaitable[Any]]) -> None:
        reply: dict[str, Any] = {"t": "reply", "id": call_id, "ok": True, "value": None}
        try:
            with call.scope:
                reply["value"] = await work(call.ticket)
            if call.scope.cancelled_caught:
                reply["cancelled"] = True
        except AgentCallError as e:
            reply = {"t": "reply", "id": call_id, "ok": False, "error": str(e), **({"kind": e.kind} if e.kind else {})}
        finally:
            self.calls.pop(call_id, None)
        await self.send_reply(reply)

    def cancel_calls(self, ids: Any, reason: str) -> None:
        """The script gave up these calls (race/waitN losers): tell the host why, then stop them."""
        if not isinstance(ids, list):
            return
        calls = [self.calls[i] for i in ids if type(i) is int and i in self.calls]
        if not calls:
            return
        try:
            self.host.calls_cancelled([c.ticket for c in calls], reason)
        except Exception:  # the calls are stopped either way
            log.exception("calls_cancelled failed")
        for c in calls:
            c.scope.cancel()

    async def request(self, msg: dict[str, Any], key: str) -> dict[str, Any] | None:
        """Send a request numbered under `key` and wait for its answer; None if the runner ended."""
        if self.done.is_set():
            return None
        self.last_request += 1
        n = self.last_request
        waiter = self.waiters[n] = _Waiter()
        try:
            await self.send({**msg, key: n})
            await waiter.event.wait()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            del self.waiters[n]
        return waiter.answer

    def answered(self, n: Any, msg: dict[str, Any]) -> None:
        waiter = self.waiters.get(n) if type(n) is int else None
        if waiter is not None:
            waiter.answer = msg
            waiter.event.set()

    async def sync(self) -> None:
        """Barrier: returns once the bridge has read everything the runner wrote while it
        handled the lines sent before this call (replies' consequences: cancels, new calls).
        Returns at once if the run has ended."""
        await self.request({"t": "sync"}, "n")

    async def settle(self, max_rounds: int = 1000) -> None:
        """Sync until a round sends no `Answered` reply: then every answer known at once
        (journal replays, also those the script's reaction to earlier ones asked for) has
        reached the script, and the cancels it caused have been handled."""
        for _ in range(max_rounds):
            before = self.answered_inline
            await self.sync()
            if self.answered_inline == before or self.done.is_set():
                return

    async def probe(self, code: str) -> Any:
        """Test hook (issue 13): run `code` as an async function in the runner's own realm,
        outside the vm. Only a runner whose environment has SWARMBASE_TEST_PROBE=1 answers;
        others ignore it, and this waits until the run ends, then raises ProbeError."""
        answer = await self.request({"t": "probe", "code": code}, "id")
        if answer is None:
            raise ProbeError("the script runner ended without answering the probe")
        if not answer.get("ok"):
            raise ProbeError(str(answer.get("error")))
        return answer.get("value")

    async def read_loop(self, nursery: trio.Nursery) -> None:
        assert self.proc.stdout is not None
        reader = LineReader(self.proc.stdout)
        async for raw in reader:
            self.liveness.heard(trio.current_time())      # any line: the runner's loop turns
            try:
                msg = json.loads(raw)
            except RecursionError:
                self.finish(ScriptOutcome(ok=False, error=TOO_DEEP))
                return
            except ValueError:
                continue
            if not isinstance(msg, dict):
                continue
            if json_depth.may_exceed(raw, MESSAGE_DEPTH) and json_depth.deeper_than(msg, MESSAGE_DEPTH):
                # The runner's hooks refuse such values before they leave the script (a
                # catchable error there); one arriving anyway is answered, never walked.
                if msg.get("t") == "call" and type(msg.get("id")) is int:
                    op = msg.get("op") if msg.get("op") in ("agent", "workflow") else "call"
                    await self.send({"t": "reply", "id": msg["id"], "ok": False, "error": f"{op}(): {TOO_DEEP}"})
                    continue
                self.finish(ScriptOutcome(ok=False, error=TOO_DEEP))
                return
            t = msg.get("t")
            if t == "call" and type(msg.get("id")) is int:
                await self.begin_call(msg, nursery)
            elif t == "cancel":
                self.cancel_calls(msg.get("ids"), str(msg.get("reason") or "cancelled by the script")[:200])
            elif t == "synced":
                self.answered(msg.get("n"), msg)
            elif t == "probe-result":
                self.answered(msg.get("id"), msg)
            elif t == "phase":
                self.host.phase(str(msg.get("title", ""))[:500])
            elif t == "log":
                self.host.log(str(msg.get("message", ""))[:MAX_LOG_CHARS])
            elif t == "done":
                if msg.get("ok"):
                    self.finish(ScriptOutcome(ok=True, value=msg.get("value")))
                else:
                    line = msg.get("line")
                    self.finish(ScriptOutcome(ok=False, error=str(msg.get("error") or "script failed"),
                                              line=line if isinstance(line, int) else None,
                                              watchdog=bool(msg.get("watchdog"))))
                return
        if reader.overflowed:
            reason = "the script's output line was too long"
        else:
            await self.stderr_done.wait()
            detail = self.stderr_tail.decode("utf-8", "replace").strip().splitlines()[-3:]
            if self.out_of_memory:
                reason = MEMORY_ERROR
            else:
                reason = "the script runner exited unexpectedly" + (": " + " | ".join(detail) if detail else "")
        self.finish(ScriptOutcome(ok=False, error=reason))

    async def read_stderr(self) -> None:
        """Keep the last few KB of the runner's stderr, to explain a crash; note an
        out-of-memory death wherever its marker falls (V8 prints a long trace after it)."""
        assert self.proc.stderr is not None
        try:
            while True:
                chunk = await self.proc.stderr.receive_some(4096)
                if not chunk:
                    return
                window = self.stderr_tail[-64:] + chunk
                if any(m in window for m in OOM_MARKERS):
                    self.out_of_memory = True
                self.stderr_tail = (self.stderr_tail + chunk)[-4096:]
        finally:
            self.stderr_done.set()

    async def ping_loop(self) -> None:
        n = 0
        while True:
            await trio.sleep(self.limits.ping_interval)
            if self.liveness.expired(trio.current_time(), self.limits.ping_interval):
                self.finish(ScriptOutcome(ok=False, watchdog=True, error=(
                    f"watchdog: the script runner did not answer for {self.limits.pong_timeout:g} s "
                    "(a busy loop?); it was killed")))
                return
            n += 1
            try:
                await self.send({"t": "ping", "n": n})
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
