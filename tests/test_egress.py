"""The network allow-list below the daemon: entries and plans (pure), netns_init and the
relay against real namespaces and real sockets (as root, in both namespace modes), and
what each engine's spec may reach. The end-to-end cases with the real CLIs and a real
daemon process are in tests/test_network.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from swarmbase import config
from swarmbase.engines.base import AgentJob
from swarmbase.launch import egress, local, netns
from swarmbase.launch.egress import Endpoint, endpoints, plan, url_endpoint
from swarmbase.launch.local import LocalLauncher
from swarmbase.launch.netns import NETNS_INIT, Namespace, NamespaceError
from swarmbase.launch.spawn import on_spawner
from swarmbase.launch.spec import LaunchSpec

from .conftest import write_config
from .sockets import listener, serve_hello


def test_entries() -> None:
    assert endpoints("PyPI.org") == (Endpoint("pypi.org", 443), Endpoint("pypi.org", 80))
    assert endpoints("git.example.com:22") == (Endpoint("git.example.com", 22),)
    assert endpoints("[::1]:8080") == (Endpoint("::1", 8080),)
    assert endpoints("10.0.0.5:443") == (Endpoint("10.0.0.5", 443),)
    for bad, why in (("https://pypi.org", "not host or host:port"), ("*.github.com", "not a host name"),
                     ("pypi.org/simple", "not host or host:port"), ("x.org:0", "between 1 and 65535"),
                     ("x.org:70000", "between 1 and 65535"), ("[2001:db8::1]:443", "other than ::1"),
                     ("-x.org", "not a host name"), ("", "not host or host:port")):
        assert why in (egress.entry_error(bad) or ""), bad


def test_base_urls() -> None:
    assert url_endpoint("https://gw.example/anthropic") == Endpoint("gw.example", 443)
    assert url_endpoint("http://127.0.0.1:4010") == Endpoint("127.0.0.1", 4010)
    assert url_endpoint("http://[::1]:9/x") == Endpoint("::1", 9)
    assert url_endpoint(egress.ANTHROPIC_API) == Endpoint("api.anthropic.com", 443)
    assert "not an http" in egress.url_error("ftp://x")
    assert "between 1 and 65535" in egress.url_error("http://x:99999")


def test_plan_gives_names_their_own_loopback_address() -> None:
    p = plan([Endpoint("127.0.0.1", 4010), Endpoint("api.example", 443), Endpoint("127.0.0.2", 80),
              Endpoint("api.example", 80), Endpoint("pypi.org", 443), Endpoint("localhost", 9),
              Endpoint("::1", 7), Endpoint("api.example", 443)])
    assert [(d.inside, str(d.to)) for d in p.doors] == [
        ("127.0.0.1:4010", "127.0.0.1:4010"), ("127.0.0.3:443", "api.example:443"),
        ("127.0.0.2:80", "127.0.0.2:80"), ("127.0.0.3:80", "api.example:80"), ("127.0.0.4:443", "pypi.org:443"),
        ("127.0.0.1:9", "localhost:9"), ("[::1]:7", "[::1]:7")]
    assert p.hosts == egress.HOSTS_HEAD + "127.0.0.3\tapi.example\n127.0.0.4\tpypi.org\n"


def test_config_network_entries(tmp_path: Path) -> None:
    path, _ = write_config(tmp_path / "s", caller_extra={"network": ["pypi.org", "github.com:22"]})
    assert config.load(path).callers[0].network == ["pypi.org", "github.com:22"]
    path, _ = write_config(tmp_path / "t", caller_extra={"network": ["pypi.org", "*.github.com"]})
    with pytest.raises(config.ConfigError, match=r"callers\[0\]\.network\[1\]: '\*\.github\.com': not a host name"):
        config.load(path)
    path, _ = write_config(tmp_path / "u", engines={"claude": {"bin": "/bin/true", "baseUrl": "gw.example"}})
    with pytest.raises(config.ConfigError, match=r"engines\.claude\.baseUrl: 'gw\.example' is not an http"):
        config.load(path)


def test_only_write_agents_get_the_callers_hosts() -> None:
    api = Endpoint("gw.example", 443)
    job = AgentJob(run_id="r", n=1, label="", engine="claude", model=None, effort=None, profile="read", schema=None,
                   prompt="p", cwd="/", api_key="k", max_usd=1, max_tokens=1, caller_max_profile="write",
                   timeout_ms=1, network=("pypi.org", "api.example:8443"))
    assert job.egress(api) == (api,)
    assert job.egress(api, "think") == (api,)
    assert job.egress(api, "write") == (api, Endpoint("pypi.org", 443), Endpoint("pypi.org", 80),
                                        Endpoint("api.example", 8443))


def test_netns_init_reports_what_failed() -> None:
    """A door it cannot open: the daemon is told why, the command never runs."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = subprocess.run([sys.executable, "-I", "-S", NETNS_INIT, str(theirs.fileno()), "auto", "127.0.0.1:7",
                           "127.0.0.1:7", "--", "/bin/sh", "-c", "echo RAN"], pass_fds=(theirs.fileno(),),
                          capture_output=True, timeout=60)
    theirs.close()
    with ours:
        msg, fds, _, _ = socket.recv_fds(ours, 4096, 4)
    assert proc.returncode == 70 and b"RAN" not in proc.stdout
    assert msg == b"error: Address already in use" and fds == []


@pytest.mark.parametrize("kind", ["thread", "helper", "userns"])
@pytest.mark.timeout(60)
async def test_a_process_reaches_its_doors_and_nothing_else(tmp_path: Path, kind: str) -> None:
    """"thread": made by the daemon (root); "helper": by netns_init (a plain namespace as
    root); "userns": by netns_init inside a user namespace, which is what a daemon that is
    not root gets. Each: the allowed port works,
    another loopback port is refused, a listed name reaches the relay, another name does
    not resolve, and the namespace is not the daemon's."""
    allowed, ap = listener()
    other, op = listener()
    tmp_path.chmod(0o755)        # the cwd: readable by the sandbox user (the tests run as root)
    (tmp_path / "procs").mkdir()
    launcher = LocalLauncher(mode="bwrap", homes=tmp_path / "homes", procs=tmp_path / "procs", netns_kind=kind)
    if kind == "userns":
        # "userns" is how a daemon that is not root makes namespaces; such a daemon has no
        # sandbox user to drop to (its children run as itself), so none here either.
        launcher.identities = None
    probe = (f"readlink /proc/self/ns/net; cat /etc/hosts; "
             f"for u in http://127.0.0.1:{ap}/ http://127.0.0.1:{op}/ http://listed.invalid:9/ http://other.invalid/; "
             f"do curl -sS -m 20 $u 2>&1; echo \" rc=$? $u\"; done")
    spec = LaunchSpec(argv=("/bin/sh", "-c", probe), env={"PATH": "/usr/bin:/bin"}, cwd=str(tmp_path), key="k",
                      read=(str(tmp_path),), egress=(Endpoint("127.0.0.1", ap), Endpoint("listed.invalid", 9)))
    lines: list[str] = []
    with trio.fail_after(50):
        async with trio.open_nursery() as n:
            n.start_soon(serve_hello, allowed, b"allowed")
            n.start_soon(serve_hello, other, b"other")
            res = await launcher.run(spec, lambda line: lines.append(line.decode()) and False)
            n.cancel_scope.cancel()
    allowed.close()
    other.close()
    out = "\n".join(lines)
    assert res.exit_code == 0, out
    assert lines[0] != os.readlink("/proc/self/ns/net")
    assert lines[1:4] == plan(spec.egress).hosts.splitlines()          # its /etc/hosts, and only that
    assert lines[3] == "127.0.0.2\tlisted.invalid"
    assert f"allowed rc=0 http://127.0.0.1:{ap}/" in out
    assert f"rc=7 http://127.0.0.1:{op}/" in out and "other rc" not in out
    assert "rc=56 http://listed.invalid:9/" in out or "rc=52 http://listed.invalid:9/" in out   # reached the relay
    assert "rc=6 http://other.invalid/" in out                                                 # never resolved
    assert await on_spawner(spawner_ns) == os.readlink("/proc/self/ns/net")


@pytest.mark.parametrize("kind", ["thread", "helper"])
@pytest.mark.timeout(60)
async def test_a_door_on_a_lan_address(tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A non-loopback IPv4 literal (a gateway by address) gets that address on the
    namespace's `lo`; here its door leads to a loopback listener, so nothing depends on
    the machine's network."""
    target, tp = listener()
    door = egress.Door(inside="10.9.8.7:80", to=Endpoint("127.0.0.1", tp))
    monkeypatch.setattr(netns, "plan", lambda allowed: egress.EgressPlan(doors=(door,), hosts=egress.HOSTS_HEAD))
    tmp_path.chmod(0o755)        # the cwd: readable by the sandbox user (the tests run as root)
    (tmp_path / "procs").mkdir()
    launcher = LocalLauncher(mode="bwrap", homes=tmp_path / "homes", procs=tmp_path / "procs", netns_kind=kind)
    if kind == "userns":
        # "userns" is how a daemon that is not root makes namespaces; such a daemon has no
        # sandbox user to drop to (its children run as itself), so none here either.
        launcher.identities = None
    spec = LaunchSpec(argv=("/bin/sh", "-c", "curl -sS -m 20 http://10.9.8.7/ 2>&1; echo \" rc=$?\""),
                      env={"PATH": "/usr/bin:/bin"}, cwd=str(tmp_path), key="k", read=(str(tmp_path),),
                      egress=(Endpoint("10.9.8.7", 80),))
    lines: list[str] = []
    with trio.fail_after(50):
        async with trio.open_nursery() as n:
            n.start_soon(serve_hello, target, b"lan")
            await launcher.run(spec, lambda line: lines.append(line.decode()) and False)
            n.cancel_scope.cancel()
    target.close()
    assert lines == ["lan rc=0"]


def spawner_ns() -> str:
    return os.readlink("/proc/thread-self/ns/net")


async def test_the_spawning_thread_goes_back_when_a_door_cannot_open() -> None:
    door = egress.Door(inside="127.0.0.1:7", to=Endpoint("127.0.0.1", 7))
    ns = Namespace([], "thread")
    ns.plan = egress.EgressPlan(doors=(door, door), hosts="")

    def enter() -> None:
        with ns.around_fork():
            raise AssertionError("the fork would have run")
    with pytest.raises(NamespaceError, match="Address already in use"):
        await on_spawner(enter)
    ns.close()
    assert await on_spawner(spawner_ns) == os.readlink("/proc/self/ns/net")


async def test_the_relay_half_closes_and_delivers_what_a_dead_client_sent() -> None:
    """A client that sends its request and shuts down writing still gets the whole answer;
    one that writes and closes at once has all it wrote delivered when the relay drains."""
    upstream, up = listener()
    door = egress.Door(inside="127.0.0.1:0", to=Endpoint("127.0.0.1", up))
    lsock, port = listener()
    relay = egress.Relay("k", [door])
    received: list[bytes] = []

    async def read_to_eof_then_answer() -> None:
        s = trio.socket.from_stdlib_socket(upstream)
        for _ in range(2):
            conn, _ = await s.accept()
            with conn:
                got = b""
                while chunk := await conn.recv(65536):
                    got += chunk
                received.append(got)
                await conn.send(b"saw %d" % len(got))

    async def roundtrip(data: bytes, read: bool) -> bytes:
        client = await trio.open_tcp_stream("127.0.0.1", port)
        await client.send_all(data)
        answer = b""
        if read:
            await client.send_eof()
            while chunk := await client.receive_some(65536):
                answer += chunk
        await client.aclose()
        return answer

    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            n.start_soon(read_to_eof_then_answer)
            relay.start(n, [lsock])
            assert await roundtrip(b"x" * 100_000, read=True) == b"saw 100000"
            await roundtrip(b"y" * 3_000_000, read=False)         # written, closed, never read
            while relay.carried < 2:                              # (a drain drops what is not connected yet)
                await trio.sleep(0.01)
            await relay.drain(grace=25)
            assert relay.sending == 0
            while len(received) < 2:            # the destination reads what was delivered
                await trio.sleep(0.01)
            n.cancel_scope.cancel()
    upstream.close()
    lsock.close()
    assert received == [b"x" * 100_000, b"y" * 3_000_000]
    assert relay.carried == 2 and relay.failed == 0 and relay.sending == 0


def test_what_each_engine_asks_for(tmp_path: Path) -> None:
    """claude: baseUrl's host:port, or the vendor API without one; codex: the meter, never
    its gateway; a write agent: the caller's hosts too; every spec asks for a namespace."""
    from swarmbase.engines.claude_agent import ClaudeEngine
    from swarmbase.engines.codex_agent import CodexEngine
    from swarmbase.engines.key_door import KeyDoor
    from swarmbase.engines.meter import Meter
    job = AgentJob(run_id="r", n=1, label="", engine="claude", model=None, effort=None, profile="write", schema=None,
                   prompt="p", cwd=str(tmp_path), api_key="k", max_usd=1, max_tokens=1, caller_max_profile="write",
                   timeout_ms=1, network=("pypi.org:443",))
    for base, api in ((None, Endpoint("api.anthropic.com", 443)), ("https://gw.example:8443/a", Endpoint("gw.example", 8443))):
        path, _ = write_config(tmp_path / f"c{bool(base)}", engines={"claude": {"bin": "/bin/true", "baseUrl": base},
                                                                    "codex": {"bin": "/bin/true", "baseUrl": "https://gw.example/c",
                                                                              "defaultModel": "m"}})
        cfg = config.load(path)
        assert ClaudeEngine(cfg).spec(job).egress == (api, Endpoint("pypi.org", 443))
        assert ClaudeEngine(cfg).spec(attrs.evolve(job, profile="read")).egress == (api,)
        # With the key door (an agent on this machine): its one door to the API leads there,
        # and the x-gate-* headers still go to a configured gateway only.
        door = KeyDoor()
        door.url = "http://127.0.0.1:5556"
        spec = ClaudeEngine(cfg, door).spec(job, "bearer")
        assert spec.egress == (Endpoint("127.0.0.1", 5556), Endpoint("pypi.org", 443))
        assert spec.env["ANTHROPIC_API_KEY"] == "bearer" and spec.env["ANTHROPIC_BASE_URL"] == door.url
        assert ("ANTHROPIC_CUSTOM_HEADERS" in spec.env) == (base is not None)
    meter = Meter()
    meter.url = "http://127.0.0.1:5555"
    codex = CodexEngine(cfg, meter, deny=lambda: ())
    assert codex.spec(job, "b", "write", True).egress == (Endpoint("127.0.0.1", 5555), Endpoint("pypi.org", 443))
    assert codex.spec(job, "b", "read", True).egress == (Endpoint("127.0.0.1", 5555),)


@pytest.mark.parametrize("kind", ["thread", "helper", "userns"])
@pytest.mark.timeout(60)
async def test_doors_work_for_a_child_without_privilege(tmp_path: Path, kind: str) -> None:
    """The child as the launcher makes it — in a user namespace of its own, every
    capability dropped, as the sandbox user when the tests run as root (issue 20): port 443
    and a loopback port still open, since the daemon made the doors before; the namespace
    still cannot be changed from inside."""
    target, tp = listener()
    tmp_path.chmod(0o755)        # the cwd: readable by the sandbox user (the tests run as root)
    (tmp_path / "procs").mkdir()
    launcher = LocalLauncher(mode="bwrap", homes=tmp_path / "homes", procs=tmp_path / "procs", netns_kind=kind)
    if kind == "userns":
        # "userns" is how a daemon that is not root makes namespaces; such a daemon has no
        # sandbox user to drop to (its children run as itself), so none here either.
        launcher.identities = None
    probe = (f"id -u; grep CapEff /proc/self/status; curl -sS -m 20 http://127.0.0.1:{tp}/; echo; "
             "curl -sS -m 20 http://api.invalid:443/ 2>/dev/null; echo \"rc=$?\"; "
             "ip link set lo down 2>/dev/null; echo \"lo-down=$?\"")
    spec = LaunchSpec(argv=("/bin/sh", "-c", probe), env={"PATH": "/usr/bin:/bin:/sbin"}, cwd=str(tmp_path), key="k",
                      read=(str(tmp_path),), egress=(Endpoint("127.0.0.1", tp), Endpoint("api.invalid", 443)))
    lines: list[str] = []
    with trio.fail_after(50):
        async with trio.open_nursery() as n:
            n.start_soon(serve_hello, target, b"door")
            await launcher.run(spec, lambda line: lines.append(line.decode()) and False)
            n.cancel_scope.cancel()
    target.close()
    assert lines[:3] == [str(u.uid if (u := launcher.user_for(None)) else os.geteuid()), "CapEff:\t0000000000000000", "door"], lines
    assert lines[3] in ("rc=52", "rc=56"), lines          # api.invalid:443 has its door (the relay cannot resolve it)
    assert lines[4] != "lo-down=0", lines


async def test_a_namespace_that_cannot_be_made_fails_the_launch_clearly(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The helper cannot open a door: the launch ends with a spawn error naming why, as
    any other launch failure (an OSError, not an exception group), and nothing ran."""
    door = egress.Door(inside="127.0.0.1:7", to=Endpoint("127.0.0.1", 7))
    monkeypatch.setattr(netns, "plan", lambda allowed: egress.EgressPlan(doors=(door, door), hosts=""))
    tmp_path.chmod(0o755)        # the cwd: readable by the sandbox user (the tests run as root)
    (tmp_path / "procs").mkdir()
    launcher = LocalLauncher(mode="bwrap", homes=tmp_path / "homes", procs=tmp_path / "procs", netns_kind="helper")
    spec = LaunchSpec(argv=("/bin/echo", "RAN"), env={"PATH": "/usr/bin:/bin"}, cwd=str(tmp_path), key="k",
                      read=(str(tmp_path),), egress=(Endpoint("127.0.0.1", 7),))
    lines: list[bytes] = []
    with trio.fail_after(30):
        res = await launcher.run(spec, lambda line: lines.append(line) and False)
    assert res.spawn_error == "could not make the agent's network namespace: Address already in use"
    assert lines == [] and list((tmp_path / "procs").iterdir()) == []


ANSWERS = {"good.test": ["203.0.113.7", "2001:db8::7"], "rebound.test": ["127.0.0.1"],
           "mixed.test": ["203.0.113.7", "127.0.0.2"], "meta.test": ["169.254.169.254"],
           "meta6.test": ["fd00:ec2::254"], "mapped.test": ["::ffff:127.0.0.1"], "linklocal.test": ["fe80::1%eth0"],
           "zero.test": ["0.0.0.0"], "lo6.test": ["::1"], "nothing.test": []}


async def test_a_name_is_refused_when_any_answer_is_this_host_or_the_metadata_service() -> None:
    """Issue 31 #4, with a resolver the test controls: every answer is checked; IP
    literals are explicit and never resolved."""
    asked: list[str] = []

    async def resolver(host: str, port: int) -> list[str]:
        asked.append(host)
        return ANSWERS[host]

    assert await egress.checked_addresses(Endpoint("good.test", 443), resolver) == ["203.0.113.7", "2001:db8::7"]
    for name in sorted(set(ANSWERS) - {"good.test"}):
        with pytest.raises(egress.DestinationRefused, match=name):
            await egress.checked_addresses(Endpoint(name, 443), resolver)
    assert asked == ["good.test", *sorted(set(ANSWERS) - {"good.test"})]
    for literal in ("127.0.0.1", "169.254.169.254", "::1"):
        assert await egress.checked_addresses(Endpoint(literal, 80), resolver) == [literal]
    assert len(asked) == len(ANSWERS)                  # literals asked nothing


async def test_the_relay_refuses_a_rebound_name_and_connects_to_what_it_checked() -> None:
    """Through a real relay: a listed name rebound to 127.0.0.1 never reaches the service
    listening there; a good name is resolved once per connection and the relay connects
    to the address it checked (the connect hook plays the remote host), not to the name."""
    upstream, up = listener()
    answers = {"rebound.test": ["127.0.0.1"], "fine.test": ["203.0.113.9"]}
    resolved: list[str] = []
    dialled: list[tuple[str, int]] = []

    async def resolver(host: str, port: int) -> list[str]:
        resolved.append(host)
        return answers[host]

    async def connect(host: str, port: int) -> trio.abc.Stream:
        dialled.append((host, port))
        return await trio.open_tcp_stream("127.0.0.1", up)    # "203.0.113.9" is played by the listener

    doors = [egress.Door(inside="127.0.0.1:0", to=Endpoint("rebound.test", up)),
             egress.Door(inside="127.0.0.1:0", to=Endpoint("fine.test", 443))]
    (l1, p1), (l2, p2) = listener(), listener()
    relay = egress.Relay("k", doors, connect=connect, resolver=resolver)
    accepted: list[bytes] = []

    async def serve() -> None:
        s = trio.socket.from_stdlib_socket(upstream)
        while True:
            conn, _ = await s.accept()
            with conn:
                accepted.append(await conn.recv(100))
                await conn.send(b"hello")

    async def ask(port: int) -> bytes:
        client = await trio.open_tcp_stream("127.0.0.1", port)
        await client.send_all(b"ping")
        answer = b""
        while chunk := await client.receive_some(100):
            answer += chunk
            if answer == b"hello":
                break
        await client.aclose()
        return answer

    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            n.start_soon(serve)
            relay.start(n, [l1, l2])
            assert await ask(p1) == b""                      # closed: refused
            assert await ask(p2) == b"hello" and await ask(p2) == b"hello"
            n.cancel_scope.cancel()
    upstream.close()
    assert relay.refused == 1 and relay.carried == 2
    assert accepted == [b"ping", b"ping"]                   # only fine.test's connections arrived
    assert resolved == ["rebound.test", "fine.test", "fine.test"]
    assert dialled == [("203.0.113.9", 443), ("203.0.113.9", 443)]
