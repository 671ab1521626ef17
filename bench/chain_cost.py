"""Cost of hash chains: journal append latency with and without chaining, same machine, one run.

    python3 bench/chain_cost.py [--appends 2000] [--result-bytes 1000] [--agents 200]

Appends journal-shaped entries with fsutil.append_line (fsync'd, as Journal.append does),
alternating plain and chained appends so both see the same disk conditions; prints the
latency percentiles of each, the sealing cost alone (no I/O), how fast a chained journal
verifies, and how long `audit` takes on a 200-agent run and the run it resumed. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from swarmbase import fsutil  # noqa: E402
from swarmbase.audit import chain  # noqa: E402


def entry(i: int, result_bytes: int) -> dict:
    return {"key": f"{i:064x}:0", "n": i, "label": f"agent {i}", "ok": True, "state": "done",
            "result": "x" * result_bytes, "engine": "claude", "model": "claude-sonnet-5-5",
            "costUsd": 0.012345, "estimated": False,
            "tokens": {"input": 12000, "output": 800, "cacheRead": 4000, "cacheWrite": 0, "total": 16800}}


def append_bytes(path: Path, line: bytes) -> None:
    """What fsutil.append_line does after serializing (the integration plan adds this as
    fsutil.append_bytes so a sealed line is written as sealed, without a second dumps)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def show(name: str, us: list[float]) -> None:
    print(f"  {name:<26} median {statistics.median(us):8.1f} µs   p90 {pct(us, 90):8.1f} µs   "
          f"p99 {pct(us, 99):8.1f} µs")


def main(n: int, result_bytes: int, agents: int) -> None:
    d = Path(tempfile.mkdtemp(prefix="sb-bench-chain-"))
    plain_path, chained_path, dict_path = d / "plain.jsonl", d / "chained.jsonl", d / "chained-dict.jsonl"
    writer = chain.ChainWriter("journal.jsonl", chain.chain_start("0" * 64, "journal.jsonl"))
    by_dict = chain.ChainWriter("journal.jsonl", writer.start)
    plain, chained, chained_dict, seal_only = [], [], [], []
    for i in range(n):
        e = entry(i, result_bytes)
        t = time.perf_counter()
        fsutil.append_line(plain_path, e)
        plain.append((time.perf_counter() - t) * 1e6)
        t = time.perf_counter()
        append_bytes(chained_path, writer.seal_line(e))
        chained.append((time.perf_counter() - t) * 1e6)
        t = time.perf_counter()
        fsutil.append_line(dict_path, by_dict.seal(e))
        chained_dict.append((time.perf_counter() - t) * 1e6)
    probe = chain.ChainWriter("journal.jsonl", writer.start)
    for i in range(n):
        e = entry(i, result_bytes)
        t = time.perf_counter()
        probe.seal_line(e)
        seal_only.append((time.perf_counter() - t) * 1e6)
    assert chained_path.read_bytes() == dict_path.read_bytes()
    data = chained_path.read_bytes()
    t = time.perf_counter()
    r = chain.verify_lines("journal.jsonl", "journal.jsonl", data, writer.start, writer.last)
    verify_s = time.perf_counter() - t
    assert r.status == "intact", r
    print(f"journal append, {n} entries of ~{len(writer.seal_line(entry(0, result_bytes)))} bytes, "
          f"fsync per line, interleaved")
    show("plain append_line", plain)
    show("chained: seal_line+bytes", chained)
    show("chained: seal+append_line", chained_dict)
    show("seal only (no I/O)", seal_only)
    extra = statistics.median(chained) - statistics.median(plain)
    print(f"  chaining adds {extra:+.1f} µs per append at the median "
          f"({extra / statistics.median(plain) * 100:+.1f} %); sealing itself is {statistics.median(seal_only):.1f} µs; "
          f"the dict path (seal + append_line) adds {statistics.median(chained_dict) - statistics.median(plain):+.1f} µs")
    print(f"verify: {n} lines ({len(data) / 1e6:.1f} MB) in {verify_s * 1000:.1f} ms "
          f"({n / verify_s:,.0f} lines/s)")
    audit_tree(d / "state", agents)


def audit_tree(state: Path, agents: int) -> None:
    """`audit` of a run of `agents` agents resumed once (both runs' every chain verified)."""
    import io

    from swarmbase.audit.render import audit_command
    from tests.audit_runs import AgentSpec, write_run
    old = write_run(state, [AgentSpec(f"a{i}") for i in range(agents)])
    new = write_run(state, [AgentSpec(f"a{i}", replayed=True) for i in range(agents)], resumed_from=old)
    t = time.perf_counter()
    code = audit_command(state, new.id, True, io.StringIO(), io.StringIO())
    s = time.perf_counter() - t
    assert code == 0
    print(f"audit --json of a {agents}-agent run and the run it resumed ({2 * agents} agent records, "
          f"{2 * (agents + 3)} chains): {s * 1000:.0f} ms")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--appends", type=int, default=2000)
    p.add_argument("--result-bytes", type=int, default=1000)
    p.add_argument("--agents", type=int, default=200, help="agents per run in the audit figure")
    a = p.parse_args()
    main(a.appends, a.result_bytes, a.agents)
