"""What keying SSE viewers on what they cannot forge costs per stream admitted.

    python3 bench/sse_admission.py [--n 2000]

Prints the median and p95 of: one sock_diag lookup of the account behind a real loopback
connection (dashboard/peers.peer_uid), a whole viewer key (the lookup plus the header
checks), and Viewers.admit at the 256-stream cap with 256 distinct forged logins held
(the fairness walk that makes room, then the drop).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time
from typing import Any, Callable

from dashboard.admission import MAX_STREAMS, Viewers
from dashboard.peers import peer_uid, viewer_key


def timed(fn: Callable[[], Any], n: int) -> tuple[float, float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.95) - 1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    n = ap.parse_args().n
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        with socket.create_connection(srv.getsockname()):
            conn, peer = srv.accept()
            with conn:
                local = srv.getsockname()
                scope = {"client": peer, "server": local, "headers": [
                    (b"host", b"box.tail1234.ts.net:7360"), (b"x-forwarded-for", b"100.101.102.103"),
                    (b"tailscale-user-login", b"someone@example.com")]}
                med, p95 = timed(lambda: peer_uid(peer, local), n)
                print(f"sock_diag lookup of the peer's account: median {med:.1f} µs, p95 {p95:.1f} µs")
                med, p95 = timed(lambda: viewer_key(scope, "box.tail1234.ts.net"), n)
                print(f"whole viewer key (lookup + proxy check): median {med:.1f} µs, p95 {p95:.1f} µs")
    viewers = Viewers(clock=lambda: 0.0)
    for i in range(MAX_STREAMS):
        v = viewers.admit(("uid 1001", "127.0.0.1", "tailnet", f"forged{i}"))
        assert not isinstance(v, str)
        v.drop = lambda: None
    i = [0]

    def admit_at_cap() -> None:
        i[0] += 1
        v = viewers.admit((f"uid {i[0] % 7}", "127.0.0.1", "direct", ""))
        assert not isinstance(v, str)
        v.drop = lambda: None
        viewers.leave(v)                       # keep the flood holding the cap
        filler = viewers.admit(("uid 1001", "127.0.0.1", "tailnet", f"again{i[0]}"))
        assert not isinstance(filler, str)
        filler.drop = lambda: None
    med, p95 = timed(admit_at_cap, n)
    print(f"admit at the cap of {MAX_STREAMS} (room made from the flood) + leave + refill: "
          f"median {med:.1f} µs, p95 {p95:.1f} µs")


if __name__ == "__main__":
    main()
