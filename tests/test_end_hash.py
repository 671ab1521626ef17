"""The run-end notice carries the hash of the run's sealed end record, and
`python -m swarmbase audit RUN_ID --expect-hash HASH` checks the run against it: a
consistent rewrite of the run's records (one the chains alone cannot show) is caught.
Against the real daemon process, including a daemon that died between writing the end
record and amending its notice."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from swarmbase.notify import notices
from swarmbase.audit import chain, seal
from swarmbase.audit.render import audit_command
from swarmbase.client import connect

from .clidaemon import cli_daemon
from .conftest import write_config


def test_with_end_hash_adds_it_once() -> None:
    base = {"eventId": "run_x:end", "origin": {"source": "swarmbase", "runId": "run_x"},
            "payload": {"content": [{"type": "text", "text": "Run done."}]}}
    got = notices.with_end_hash(base, "ab" * 32)
    assert got["origin"]["endHash"] == "ab" * 32 and notices.end_hash_of(got) == "ab" * 32
    assert got["payload"]["content"][0]["text"] == "Run done.\nEnd record hash: " + "ab" * 32
    assert notices.with_end_hash(got, "cd" * 32) is got and notices.end_hash_of(base) is None   # base untouched


def audit_cli(cfg: Path, *args: str) -> tuple[int, str]:
    p = subprocess.run([sys.executable, "-m", "swarmbase", "audit", *args], capture_output=True, text=True,
                       env=dict(os.environ, SWARMBASE_CONFIG=str(cfg)), timeout=60)
    return p.returncode, p.stdout + p.stderr


def audit(state: Path, run_id: str, expect_hash: str | None = None, as_json: bool = False) -> tuple[int, str]:
    out = io.StringIO()
    return audit_command(state, run_id, as_json, out, out, expect_hash=expect_hash), out.getvalue()


def run_json(state: Path, run_id: str) -> Path:
    return next((state / "runs").glob(f"*-{run_id}")) / "run.json"


def rewrite_label(path: Path, label: str) -> None:
    """What someone with write access to the disk can do: change a fact and re-seal the end
    record so that every chain still verifies."""
    rj = json.loads(path.read_text())
    end = rj["end"]
    facts = {k: end[k] for k in seal.END_FACTS if k in end}
    facts["label"] = rj["label"] = label
    rj["end"] = chain.end_record(run=facts, link=end["link"], chains=end["chains"], files=end["files"])
    path.write_text(json.dumps(rj))


async def start_run(h: Any, script: str) -> str:
    res = await h.tool("run", {"script": script, "label": "hashed"})
    return res["structuredContent"]["runId"]


@pytest.mark.timeout(120)
async def test_the_notice_carries_the_end_hash_and_audit_checks_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cfg, tokens = write_config(state, callers=["alice"])
    async with cli_daemon(cfg) as d:
        with trio.fail_after(60):
            async with connect(d.ws, tokens["alice"]) as h:
                await h.handshake()
                run_id = await start_run(h, "log('one'); phase('p'); return {x: 1};")
                notice = await h.wait_notice(f"{run_id}:end")
            # Two more runs end while no host takes notices: theirs stay queued.
            async with connect(d.ws, tokens["alice"]) as h:
                await h.handshake(grant=False)
                queued_id, unwritten_id = await start_run(h, "return 2;"), await start_run(h, "return 3;")
                for rid in (queued_id, unwritten_id):
                    while (await h.tool("status", {"runId": rid}))["structuredContent"]["status"] != "completed":
                        await trio.sleep(0.1)
    end_hash = json.loads(run_json(state, run_id).read_text())["end"]["hash"]
    assert notice["origin"]["endHash"] == end_hash
    assert notice["payload"]["content"][0]["text"].endswith(f"\nEnd record hash: {end_hash}")

    code, text = await trio.to_thread.run_sync(audit_cli, cfg, run_id, "--expect-hash", end_hash)
    assert code == 0 and "verified: every chain is intact, and the end record hash is the expected one" in text
    code, text = audit(state, run_id, "0" * 64, as_json=True)
    report = json.loads(text)
    assert code == 1 and report["verified"] is False and report["break"] is None
    assert f"end record hash is {end_hash}, not the expected {'0' * 64}" in report["hashMismatch"]
    # A consistent rewrite: the chains alone still verify, the kept hash does not.
    rewrite_label(run_json(state, run_id), "rewritten")
    code, text = audit(state, run_id)
    assert code == 0, text
    code, text = audit(state, run_id, end_hash)
    assert code == 1 and "BROKEN:" in text and "records were rewritten" in text

    # The daemon died after writing the second run's end record but before amending its
    # notice; and after queuing the third run's notice but before its final record. The
    # next boot stamps the hash on both (the third's record is completed from its notice).
    for rid in (queued_id, unwritten_id):
        drop_amend(state / "outbox.jsonl", f"{rid}:end")
    path = run_json(state, unwritten_id)
    rj = json.loads(path.read_text())
    path.write_text(json.dumps({**rj, "status": "running", "endedAt": None, "end": None,
                                "history": rj["history"][:-1]}))
    async with cli_daemon(cfg) as d:
        with trio.fail_after(60):
            async with connect(d.ws, tokens["alice"]) as h:
                await h.handshake()
                late = [await h.wait_notice(f"{rid}:end") for rid in (queued_id, unwritten_id)]
    for rid, n in zip((queued_id, unwritten_id), late):
        end = json.loads(run_json(state, rid).read_text())["end"]
        assert n["origin"]["endHash"] == end["hash"] and n["tags"][-1] == "swarmbase:completed"
        assert audit(state, rid, end["hash"])[0] == 0
    assert "Traceback" not in d.stderr.decode(errors="replace")


def drop_amend(outbox: Path, event_id: str) -> None:
    """The outbox log as it was before `event_id`'s notice was amended with its hash."""
    lines = outbox.read_bytes().splitlines(keepends=True)
    adds = [i for i, ln in enumerate(lines) if json.loads(ln).get("notice", {}).get("eventId") == event_id]
    assert len(adds) == 2 and "endHash" in json.loads(lines[adds[1]])["notice"]["origin"]
    outbox.write_bytes(b"".join(ln for i, ln in enumerate(lines) if i != adds[1]))
