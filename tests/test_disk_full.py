"""A disk that fills up after the model has answered (issue 25 #6): the real daemon
process on a small tmpfs, two real Claude Code agents whose replies are paid for, the disk
filled to the last byte before the fake API answers. No paid result is lost: the agents
end done (their transcripts stop short), their results wait in memory, resume refuses
until they are journaled, and once space returns resume replays both with no new request.

Each reply is much bigger than a page, so neither its transcript line nor its journal line
can slip into the slack of a page a file already holds."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from swarmbase import fsutil
from swarmbase.client import connect
from swarmbase.runs import journal as journal_mod
from swarmbase.runs.deferred import Deferred
from swarmbase.runs.journal import Journal, args_hash
from swarmbase.runs.model import TERMINAL

from .clidaemon import cli_daemon
from .conftest import audit, write_config
from .fakes.anthropic_api import FakeAnthropic

# 60 KB: more than the few pages the daemon frees as agents end (their process records),
# so neither a reply's transcript line nor its journal line can find room on the full disk.
REPLY = "paid " * 12_000


def fill_to_the_last_byte(filler: Path) -> None:
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (1 << 20, 4096, 1):
            try:
                while os.write(fd, b"\0" * chunk) == chunk:
                    pass
            except OSError as e:
                assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)


def full_disk_config(small_disk: Path, claude_bin: str, tmp_path: Path, api_url: str) -> tuple[Path, Path, dict[str, str]]:
    """The daemon's state on the small disk: (state dir, config path, tokens)."""
    state = small_disk / "state"
    state.mkdir()
    key = state / "alice.key"
    key.write_text("sk-ant-disk-full-000111222")
    key.chmod(0o600)
    path, tokens = write_config(state, callers=["alice"], engines={"claude": {"bin": claude_bin, "baseUrl": api_url}},
                                caller_extra={"apiKeyFile": str(key), "runUsdMax": 100},
                                # The agents' private dirs elsewhere: removed as each agent ends,
                                # they would free space on the disk under test.
                                homesDir=str(tmp_path / "homes"))
    return state, path, tokens


async def start_paid_pair(h: Any, api: FakeAnthropic) -> str:
    """A run of two agents with big replies, returned once both are asking the model (gated)."""
    script = ("return await parallel([() => agent('[[gate]] [[text:%s]] a'), () => agent('[[gate]] [[text:%s]] b')])"
              % (REPLY, REPLY))
    rid: str = (await h.tool("run", {"script": script, "budgetUsd": 20}))["structuredContent"]["runId"]
    while sum("[[gate]]" in r["prompt"] for r in api.requests) < 2:      # both are asking the model
        await trio.sleep(0.05)
    return rid


@pytest.mark.timeout(240)
async def test_a_full_disk_after_the_paid_replies_loses_no_result(small_disk: Path, claude_bin: str,
                                                                  tmp_path: Path, nursery: trio.Nursery) -> None:
    api = await nursery.start(FakeAnthropic().serve)
    state, path, tokens = full_disk_config(small_disk, claude_bin, tmp_path, api.url)
    filler = small_disk / "filler"
    with trio.fail_after(220):
        async with cli_daemon(path) as d:
            async with connect(d.ws, tokens["alice"]) as h:
                await h.handshake()
                rid = await start_paid_pair(h, api)
                fill_to_the_last_byte(filler)
                paid = len(api.requests)
                api.gate.set()                                # the model answers: both replies are paid for
                end = await h.wait_notice(f"{rid}:end")
                assert "swarmbase:failed" in end["tags"], end["payload"]["content"][0]["text"][:600]  # its result could not be saved
                # A failed run's error is framed as data, in the notice's second block (issue 24 #5).
                assert "the result could not be saved: the disk is full" in end["payload"]["content"][1]["text"]
                st = (await h.tool("status", {"runId": rid}))["structuredContent"]
                assert [a["state"] for p in st["phases"] for a in p["agents"]] == ["done", "done"]
                refused = await h.tool("resume", {"runId": rid})
                assert refused["isError"] and "2 of its agent results are not journaled yet" in \
                    refused["content"][0]["text"] and "the disk is full" in refused["content"][0]["text"]

                filler.unlink()                               # space returns
                again = (await h.tool("resume", {"runId": rid}))["structuredContent"]["runId"]
                done = await h.wait_notice(f"{again}:end")
                assert "swarmbase:completed" in done["tags"]
                new_requests = len(api.requests) - paid
                rows = [a for p in (await h.tool("status", {"runId": again}))["structuredContent"]["phases"]
                        for a in p["agents"]]
                value = json.loads((await h.tool("result", {"runId": again, "limit": 200_000}))["structuredContent"]
                                   ["text"])
                run_dir = next((state / "runs").glob(f"*-{rid}"))
                while not json.loads((run_dir / "run.json").read_text()).get("end"):
                    await trio.sleep(0.2)                     # the resave loop writes the sealed record too
        err = d.stderr.decode()
    print(f"\npaid agent results lost to ENOSPC: {new_requests} of 2 (API requests made by the resume)")
    assert new_requests == 0
    assert len(rows) == 2 and all(a["replayed"] for a in rows)
    assert value == [REPLY, REPLY]
    sealed = json.loads((run_dir / "run.json").read_text())
    assert (sealed["status"], sealed["resumedAs"]) == ("failed", again)
    ok = [e for e in map(json.loads, (run_dir / "journal.jsonl").read_text().splitlines()[1:]) if e.get("ok")]
    assert [e["result"] for e in ok] == [REPLY, REPLY]
    assert f"run {rid}: the disk is full" in err and "journaled when space returns" in err
    assert "its transcript stops after" in err
    # Written late, its records still verify: journal, log and agents sealed under one end record.
    code, text = audit(state, rid)
    assert code == 0 and "every chain is intact" in text, text


async def test_waiting_journal_lines_are_written_in_order_or_reported_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    journal = Journal(tmp_path / "journal.jsonl", "run_0123456789ab", args_hash(None), caller="alice")
    real = fsutil.append_bytes
    full = OSError(errno.ENOSPC, "No space left on device")

    def refuse(path: Path, data: bytes, durable: bool = True) -> None:
        real(path, data[: len(data) // 2], durable)      # a short write, then the disk is full
        raise full
    deferred = Deferred(tmp_path)
    monkeypatch.setattr(fsutil, "append_bytes", refuse)
    for i in range(3):
        with pytest.raises(OSError):
            journal.append({"key": f"k{i}", "ok": True, "result": i})
        deferred.journal_refused("run_0123456789ab", journal, full)
    assert len(journal.pending) == 3 and caplog.text.count("kept in memory") == 1
    assert deferred.journal_now("run_0123456789ab") == "3 of its agent results are not journaled yet (the disk is full)"
    async def no_final_write(live: object) -> None:
        raise AssertionError("no run waits for its final write here")
    await deferred.last_chance({}, no_final_write)
    assert "3 paid agent result(s) could not be journaled" in caplog.text
    monkeypatch.setattr(fsutil, "append_bytes", real)
    assert await deferred.write_journal("run_0123456789ab") and deferred.journals == {}
    loaded = journal_mod.load(tmp_path / "journal.jsonl")
    assert loaded.torn == 0 and [e["result"] for e in loaded.lines] == [0, 1, 2]    # no half line, in order


@pytest.mark.timeout(240)
async def test_a_stop_before_space_returns_keeps_the_end_and_the_paid_results(
        small_disk: Path, claude_bin: str, tmp_path: Path, nursery: trio.Nursery) -> None:
    """Issue 32 #12: the disk fills after the model answered and the daemon is stopped before
    space returns. The next start must not contradict the end notice the host acknowledged
    under the same eventId, and the paid results must not be lost."""
    api = await nursery.start(FakeAnthropic().serve)
    state, path, tokens = full_disk_config(small_disk, claude_bin, tmp_path, api.url)
    filler = small_disk / "filler"
    with trio.fail_after(220):
        async with cli_daemon(path) as d:
            async with connect(d.ws, tokens["alice"]) as h:
                await h.handshake()
                rid = await start_paid_pair(h, api)
                fill_to_the_last_byte(filler)
                api.gate.set()
                first = await h.wait_notice(f"{rid}:end")     # acknowledged by this host
        err = d.stderr.decode()                               # stopped (SIGTERM) with the disk still full
        filler.unlink()
        async with cli_daemon(path) as d:
            async with connect(d.ws, tokens["alice"]) as h:
                await h.handshake()
                st = (await h.tool("status", {"runId": rid}))["structuredContent"]
    ended = next(t.split(":", 1)[1] for t in first["tags"] if t.split(":", 1)[1] in TERMINAL)
    adds = [json.loads(line) for line in (state / "outbox.jsonl").read_text().splitlines()]
    ends = [a["notice"] for a in adds if a["op"] == "add" and a["notice"]["eventId"].startswith(f"{rid}:end")]
    for n in ends:                   # a notice saying otherwise than the acknowledged one has its own id
        if f"swarmbase:{ended}" not in n["tags"]:
            assert n["eventId"] != f"{rid}:end", n["payload"]["content"][0]["text"]
    assert st["status"] == ended, (st["status"], st["error"])
    run_dir = next((state / "runs").glob(f"*-{rid}"))
    ok = [e for e in map(json.loads, (run_dir / "journal.jsonl").read_text().splitlines()[1:]) if e.get("ok")]
    assert [e["result"] for e in ok] == [REPLY, REPLY], err[-2000:]      # the paid results were kept
    assert "gave back the 512 KiB kept in reserve" in err               # kept by the reserve, not by luck
