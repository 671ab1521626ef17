"""Who an SSE viewer is (dashboard/peers.py) and how streams are shared by that key
(dashboard/admission.py): pure logic, plus the kernel's answer for a real loopback socket."""

from __future__ import annotations

import os
import socket
from typing import Any

from dashboard.admission import Viewers
from dashboard.peers import peer_uid, through_tailnet_proxy, viewer_key

PROXY = "box.tail1234.ts.net"


def scope(peer: str = "127.0.0.1", host: str = "127.0.0.1:7360", **headers: str) -> dict[str, Any]:
    hs = [(b"host", host.encode())] + [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    return {"client": (peer, 50000), "server": ("127.0.0.1", 7360), "headers": hs}


def tailnet(login: str, peer: str = "127.0.0.1") -> dict[str, Any]:
    """What `tailscale serve` sends for a tailnet user (and what a local forger can copy)."""
    return scope(peer, f"{PROXY}:7360", tailscale_user_login=login, x_forwarded_for="100.101.102.103")


def uid0(peer: tuple[str, int], local: tuple[str, int]) -> int:
    return 0


def test_a_login_counts_only_on_the_proxy_route() -> None:
    def key(s: dict[str, Any], proxy: str | None = PROXY) -> tuple[str, ...]:
        return viewer_key(s, proxy, uid_of=uid0)
    assert key(scope()) == ("uid 0", "127.0.0.1", "direct", "")
    assert key(scope(tailscale_user_login="forged@x")) == ("uid 0", "127.0.0.1", "direct", "")
    assert key(tailnet("you@x")) == ("uid 0", "127.0.0.1", "tailnet", "you@x")
    assert key(tailnet("you@x"), proxy=None) == ("uid 0", "127.0.0.1", "direct", "")      # no publicUrl
    not_tailnet = scope(host=f"{PROXY}:7360", tailscale_user_login="you@x", x_forwarded_for="10.0.0.7")
    assert not through_tailnet_proxy(not_tailnet, PROXY)
    wrong_host = scope(tailscale_user_login="you@x", x_forwarded_for="100.101.102.103")
    assert not through_tailnet_proxy(wrong_host, PROXY)
    v6 = scope(host=f"{PROXY}:7360", tailscale_user_login="you@x", x_forwarded_for="fd7a:115c:a1e0::53")
    assert through_tailnet_proxy(v6, PROXY)
    assert not through_tailnet_proxy(tailnet("you@x", peer="192.0.2.9"), PROXY)        # not from loopback
    # Without an answer from the kernel, every loopback peer is one account.
    assert viewer_key(scope(peer="127.0.0.9"), PROXY, uid_of=lambda p, s: None) == (
        "loopback", "127.0.0.9", "direct", "")
    assert viewer_key(scope(peer="192.0.2.9"), PROXY, uid_of=uid0)[0] == "192.0.2.9"


def test_the_kernel_names_the_account_behind_a_loopback_connection() -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        with socket.create_connection(srv.getsockname()):
            conn, peer = srv.accept()
            with conn:
                assert peer_uid(peer, srv.getsockname()) == os.geteuid()
                assert peer_uid((peer[0], 1), srv.getsockname()) is None      # no such socket


def droppable(v: Viewers, key: tuple[str, ...], dropped: list[tuple[str, ...]]) -> Any:
    viewer = v.admit(key)
    assert not isinstance(viewer, str), viewer
    viewer.drop = lambda: dropped.append(key)
    return viewer


def test_at_the_cap_a_heavier_branch_yields_level_by_level() -> None:
    dropped: list[tuple[str, ...]] = []
    plain = ("uid 0", "127.0.0.1", "direct", "")
    # Another account's forged tailnet logins fill the daemon: an account with none gets in.
    v = Viewers(max_total=8, max_per_client=16, clock=lambda: 0.0)
    for i in range(8):
        droppable(v, ("uid 1001", "127.0.0.1", "tailnet", f"forged{i}"), dropped)
    assert "at most 8" in v.admit(("uid 1001", "127.0.0.1", "tailnet", "forged9"))    # the flood is refused
    droppable(v, plain, dropped)
    assert dropped == [("uid 1001", "127.0.0.1", "tailnet", "forged0")] and v.count == 8
    # The same account forging logins: the route level keeps the direct viewer in.
    dropped.clear()
    v = Viewers(max_total=8, max_per_client=16, clock=lambda: 0.0)
    for i in range(8):
        droppable(v, ("uid 0", "127.0.0.1", "tailnet", f"forged{i}"), dropped)
    droppable(v, plain, dropped)
    assert len(dropped) == 1 and dropped[0][2] == "tailnet"
    # Balanced branches: nobody holds two more than the newcomer's branch, so it waits.
    v = Viewers(max_total=4, max_per_client=16, clock=lambda: 0.0)
    for i in range(4):
        droppable(v, (f"uid {i}", "127.0.0.1", "direct", ""), dropped)
    assert "at most 4" in v.admit(("uid 9", "127.0.0.1", "direct", "")) and v.refused == 1


def test_a_flood_sharing_a_key_only_churns_itself() -> None:
    dropped: list[tuple[str, ...]] = []
    v = Viewers(max_total=256, max_per_client=16, clock=lambda: 0.0)
    key = ("uid 0", "127.0.0.1", "direct", "")
    idle = [droppable(v, key, dropped) for _ in range(16)]
    newcomer = droppable(v, key, dropped)          # 16 idle streams do not lock it out
    assert dropped == [key] and v.by_client[key] == idle[1:] + [newcomer] and v.refused == 0
    other = droppable(v, ("uid 1000", "127.0.0.1", "direct", ""), dropped)
    assert other in v.by_client[other.client] and len(dropped) == 1
    for viewer in list(v.by_client[key]):
        v.leave(viewer)
    assert v.tree == {(): {"uid 1000": 1}, ("uid 1000",): {"127.0.0.1": 1},
                      ("uid 1000", "127.0.0.1"): {"direct": 1}, ("uid 1000", "127.0.0.1", "direct"): {"": 1}}
