"""One MCPL Session without a network: a Transport whose peer is the test, a Supervisor
stand-in that only carries the live config (what the session's token check reads), and a
config with one caller's token rotated."""

from __future__ import annotations

import hashlib
import random
import secrets
from pathlib import Path

import attrs
import trio

from swarmbase import config
from swarmbase.mcpl.session import Hub, Session
from swarmbase.notify.outbox import Outbox

from .conftest import write_config


@attrs.define
class Wire:
    """A Transport whose peer is the test: frames in through `inbox`, out into `sent`."""
    inbox_send: trio.MemorySendChannel[str]
    inbox: trio.MemoryReceiveChannel[str]
    sent: list[str] = attrs.Factory(list)
    closes: list[tuple[int, str]] = attrs.Factory(list)
    close_fails: bool = False

    @classmethod
    def new(cls, close_fails: bool = False) -> "Wire":
        s, r = trio.open_memory_channel[str](100)
        return cls(s, r, close_fails=close_fails)

    async def send(self, text: str) -> None:
        self.sent.append(text)

    async def receive(self) -> str | bytes:
        return await self.inbox.receive()

    async def close(self, code: int, reason: str) -> None:
        self.closes.append((code, reason))
        if self.close_fails:
            raise OSError("the close frame could not be sent")


@attrs.define
class FakeEnv:
    cfg: config.Config


@attrs.define
class FakeSup:
    env: FakeEnv


def configs(tmp_path: Path) -> tuple[config.Config, config.Config, dict[str, str]]:
    """The running config and one where dave's token is rotated."""
    path, tokens = write_config(tmp_path / "state", callers=["alice", "dave"])
    old = config.load(path)
    tok = secrets.token_hex(24)
    rotated = attrs.evolve(old, callers=[
        attrs.evolve(c, tokenSha256=hashlib.sha256(tok.encode()).hexdigest()) if c.name == "dave" else c
        for c in old.callers])
    return old, rotated, tokens


def session(wire: Wire, cfg: config.Config, sup: FakeSup, hub: Hub, name: str, tmp_path: Path) -> Session:
    caller = cfg.caller(name)
    return Session(wire, caller, sup, Outbox(tmp_path / "outbox.jsonl"), hub,   # type: ignore[arg-type]
                   rng=random.Random(0))
