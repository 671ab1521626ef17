"""Which of a caller's sessions pushes which notice (swarmbase/notify/routing.py), as pure
state: a run's starter takes its notices while it can, an own-runs-only session takes
nothing else, one push of a notice at a time, and every change wakes the push loops."""

from __future__ import annotations

from pathlib import Path

import attrs

from swarmbase.notify.routing import Routes


@attrs.define(eq=False)
class Peer:
    can_push: bool = True
    own_runs_only: bool = False
    runs: set[str] = attrs.Factory(set)

    def owns(self, run_id: str) -> bool:
        return run_id in self.runs


def notice(run_id: str, kind: str = "end") -> dict[str, object]:
    return {"eventId": f"{run_id}:{kind}", "origin": {"source": "swarmbase", "runId": run_id}}


def test_a_runs_starter_takes_its_notices_and_the_rest_go_to_the_others() -> None:
    routes = Routes()
    resident, client = Peer(), Peer(own_runs_only=True, runs={"run_b"})
    routes.open(resident)
    routes.open(client)
    assert routes.allows(client, notice("run_b")) and not routes.allows(resident, notice("run_b"))
    assert routes.allows(resident, notice("run_a")) and not routes.allows(client, notice("run_a"))
    # The starter cannot push (a one-shot call selected no notices): anybody's.
    client.can_push = False
    assert routes.allows(resident, notice("run_b"))
    # The starter is gone: the resident takes it.
    client.can_push = True
    routes.close(client)
    assert routes.allows(resident, notice("run_b"))


def test_one_push_of_a_notice_at_a_time_and_each_change_wakes() -> None:
    routes = Routes()
    a, b = Peer(), Peer()
    routes.open(a)
    routes.open(b)
    woken = routes.changed_event()
    routes.claim(a, "run_a:end")
    assert routes.allows(a, notice("run_a")) and not routes.allows(b, notice("run_a"))
    routes.release("run_a:end")
    assert woken.is_set() and routes.allows(b, notice("run_a"))
    # A session that closes mid-push lets go of its claim.
    routes.claim(a, "run_a:end")
    woken = routes.changed_event()
    routes.close(a)
    assert woken.is_set() and routes.allows(b, notice("run_a"))


def test_a_sessions_own_runs_are_bounded(tmp_path: Path) -> None:
    import random

    from swarmbase.mcpl import session as session_mod
    from swarmbase.mcpl.session import Hub, Session
    from swarmbase.notify.outbox import Outbox

    from .session_wire import FakeEnv, FakeSup, Wire, configs
    old, _, _ = configs(tmp_path)
    s = Session(Wire.new(), old.caller("alice"), FakeSup(FakeEnv(old)), Outbox(tmp_path / "o.jsonl"),  # type: ignore[arg-type]
                Hub(), rng=random.Random(0))
    for i in range(session_mod.OWN_RUNS_KEPT + 1):
        s._started({"name": "run"}, {"structuredContent": {"runId": f"run_{i:012x}"}})
    assert not s.owns(f"run_{0:012x}") and s.owns(f"run_{1:012x}") and s.owns(f"run_{session_mod.OWN_RUNS_KEPT:012x}")
    s._started({"name": "status"}, {"structuredContent": {"runId": "run_ffffffffffff"}})    # not a start
    s._started({"name": "run"}, {"structuredContent": {"error": "x"}, "isError": True})
    assert not s.owns("run_ffffffffffff")
