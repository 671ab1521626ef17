"""The meter on its own: SSE scanning, usage booking, ceilings, and outbound TLS
(certificate failures surface with the hint; NODE_EXTRA_CA_CERTS is honoured)."""

from __future__ import annotations

import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import hypercorn.config
import hypercorn.trio
import trio

from swarmbase.daemon import serve_relay
from swarmbase.engines.bearer_relay import ssl_context
from swarmbase.engines.meter import CERT_HINT, EventScanner, Meter, event_data

from .fakes.responses_api import FakeResponses


def test_scanner_finds_events_across_chunks() -> None:
    sc = EventScanner()
    stream = b'event: a\ndata: {"type":"a"}\n\nevent: b\ndata: {"type":"b","x":1}\n\n'
    got = []
    for i in range(0, len(stream), 7):
        got += sc.feed(stream[i:i + 7])
    assert [event_data(w)["type"] for w, _ in got] == ["a", "b"]


def test_scanner_keeps_only_the_tail_of_a_huge_event() -> None:
    sc = EventScanner()
    big = b'data: {"type":"response.completed","response":{"output":"' + b"x" * 3_000_000 + \
        b'","usage":{"input_tokens":7,"output_tokens":5}}}\n\n'
    got = []
    for i in range(0, len(big), 65536):
        got += sc.feed(big[i:i + 65536])
        assert len(sc.buf) + len(sc.tail) <= 1_200_000          # never the whole event in memory
    [(whole, tail)] = got
    assert whole is None and b'"usage":{"input_tokens":7' in tail


def test_scan_counts_deltas_exactly_as_feed_sees_them_whatever_the_chunking() -> None:
    import random
    prefix, overhead = b"event: response.output_text.delta\n", 160
    delta = lambda n: prefix + b'data: {"type":"response.output_text.delta","delta":"' + b"y" * n + b'"}\n\n'
    stream = b"".join([b'event: response.created\ndata: {"type":"response.created"}\n\n',
                       *(delta(n) for n in (0, 5, 200, 1000, 70_000, 3)), b"\n\n",
                       b'data: {"type":"x","big":"' + b"z" * 1_100_000 + b'"}\n\n', delta(900),
                       b'event: response.completed\ndata: {"type":"response.completed","response":{"usage":'
                       b'{"input_tokens":1,"output_tokens":2}}}\n\n'])
    whole = EventScanner().feed(stream)
    expect_other = [e for e in whole if not (e[0] or b"").startswith(prefix)]
    expect_count = sum(max(0, len(w) - overhead) for w, _ in whole if (w or b"").startswith(prefix))
    rng = random.Random(5)
    for _ in range(40):
        sc, other, count, pos = EventScanner(), [], 0, 0
        while pos < len(stream):
            step = rng.choice([1, 2, 7, 100, 4096, 65536, 300_000])
            events, measured = sc.scan(stream[pos:pos + step], prefix, overhead)
            count += measured
            for e in events:
                if (e[0] or b"").startswith(prefix):
                    count += max(0, len(e[0]) - overhead)
                else:
                    other.append(e)
            pos += step
        assert count == expect_count
        assert [(w, t[-64:]) for w, t in other] == [(w, t[-64:]) for w, t in expect_other]


def make_cert(tmp: Path) -> tuple[Path, Path]:
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


async def serve_tls(nursery: trio.Nursery, app: Any, cert: Path, key: Path) -> str:
    cfg = hypercorn.config.Config()
    cfg.bind = ["127.0.0.1:0"]
    cfg.certfile, cfg.keyfile = str(cert), str(key)
    cfg.accesslog = cfg.errorlog = None
    binds = await nursery.start(partial(hypercorn.trio.serve, app, cfg))
    return binds[0].replace("http://", "https://")


async def relay_once(meter: Meter, upstream: str, prompt: str = "[[text:through tls]]") -> tuple[int, Any, list[str]]:
    killed: list[str] = []
    agent = meter.register(run_id="run_x", n=1, label="t", gateway_token="gw", upstream=upstream,
                           max_tokens=10**9, max_usd=None, price=None, kill=killed.append)
    body = {"model": "m", "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]}]}
    async with httpx.AsyncClient(timeout=30) as c:
        r = await c.post(meter.url + "/responses", json=body, headers={"Authorization": f"Bearer {agent.bearer}"})
    meter.unregister(agent)
    return r.status_code, (agent, r.text), killed


async def test_tls_failure_surfaces_with_hint_and_extra_ca_is_honoured(tmp_path: Path, nursery: trio.Nursery) -> None:
    cert, key = make_cert(tmp_path)
    fake = FakeResponses()
    upstream = await serve_tls(nursery, fake.app(), cert, key)

    plain = Meter()
    await nursery.start(serve_relay, plain)
    status, (agent, text), killed = await relay_once(plain, upstream)
    assert status == 502 and agent.error == CERT_HINT and killed == [CERT_HINT]
    assert "meter: upstream unable to verify the first certificate" in CERT_HINT and "NODE_EXTRA_CA_CERTS" in CERT_HINT

    trusting = Meter(client=httpx.AsyncClient(verify=ssl_context({"NODE_EXTRA_CA_CERTS": str(cert)}),
                                              timeout=httpx.Timeout(30, read=None)))
    await nursery.start(serve_relay, trusting)
    status, (agent, text), killed = await relay_once(trusting, upstream)
    assert status == 200 and killed == [] and "through tls" in text
    assert agent.used.total == 1100 and agent.responses == 1
    assert fake.requests[-1]["headers"]["authorization"] == "Bearer gw"


async def test_usage_less_response_is_counted_as_unparsed(nursery: trio.Nursery) -> None:
    fake = await nursery.start(FakeResponses().serve)
    meter = Meter()
    await nursery.start(serve_relay, meter)
    status, (agent, text), killed = await relay_once(meter, fake.url, "[[nousage]]")
    assert status == 200 and agent.used.total == 0 and agent.unparsed == 1
    assert "no usage here" in text
