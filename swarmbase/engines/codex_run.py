"""One codex agent: throwaway CODEX_HOME, meter registration, the process (inside
bubblewrap unless sandbox is "none"), and its verdict with metered tokens and cost."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from .. import fsutil, prices
from ..config import Config
from ..prices import Tokens
from . import codex
from .meter import Meter, MeterAgent
from .process import parse_json_line, run_cli
from .verdict import Verdict

if TYPE_CHECKING:
    from ..runs.agent_opts import AgentOptions
    from ..runs.records import AgentRecord, Transcript
    from ..runs.supervisor import LiveRun


def effective_profile(profile: str, sandbox: str, max_profile: str) -> str:
    """Without the outer bwrap an unwrapped shell reads whatever the deny-list misses, so
    read/write are for callers trusted with write only; everyone else gets think."""
    if sandbox == "none" and max_profile != "write":
        return "think"
    return profile


def metered_verdict(meter_agent: MeterAgent | None, stream: codex.CodexStream | None,
                    verdict: codex.CodexVerdict | None = None) -> Verdict:
    """Tokens from the meter; the CLI's turn.completed count when the meter could not read
    a response's usage. Cost from the price row (none: $0; the token budget bounds it)."""
    tokens = meter_agent.used if meter_agent is not None else Tokens()
    if meter_agent is not None and meter_agent.unparsed and stream is not None and stream.turn_usage is not None:
        tokens = stream.turn_usage if stream.turn_usage.total > tokens.total else tokens
    cost = meter_agent.cost(tokens) if meter_agent is not None else 0.0
    exact = stream is not None and stream.completed and not (meter_agent is not None and meter_agent.estimated)
    if verdict is None:
        return Verdict(ok=False, error="stopped", cost_usd=cost, tokens=tokens, tokens_exact=exact)
    return Verdict(ok=verdict.ok, value=verdict.value, error=verdict.error, cost_usd=cost, tokens=tokens,
                          tokens_exact=exact)


async def run(*, cfg: Config, meter: Meter, live: "LiveRun", rec: "AgentRecord", opts: "AgentOptions", cwd: str,
              gateway_token: str, max_usd: float, max_tokens: int, home: Path, record: Path,
              transcript: "Transcript") -> Verdict:
    engine = cfg.engines.codex
    assert engine is not None and engine.baseUrl
    profile = effective_profile(opts.profile, engine.sandbox, live.caller.maxProfile)
    node = shutil.which("node")
    codex_home = home / "codex-home"
    (home / "home").mkdir(parents=True, exist_ok=True, mode=0o700)
    codex_home.mkdir(parents=True, exist_ok=True, mode=0o700)
    price = prices.row_for(opts.model, cfg.prices, engine="codex")
    stop: list[str] = []
    kill_scope = trio.CancelScope()

    def kill(reason: str) -> None:
        stop.append(reason)
        kill_scope.cancel()

    magent = meter.register(run_id=live.run.id, n=rec.n, label=rec.label, gateway_token=gateway_token,
                            upstream=engine.baseUrl.rstrip("/"), max_tokens=max_tokens,
                            max_usd=max_usd if price is not None else None, price=price, kill=kill)
    rec.meter = magent
    call = codex.CodexCall(
        bin=engine.bin, cwd=cwd, codex_home=str(codex_home), profile=profile, model=opts.model,
        effort=opts.effort, meter_url=meter.url,
        deny=codex.deny_paths(state_dir=cfg.state_dir, own_home=home,
                              key_files=[c.apiKeyFile for c in cfg.callers if c.apiKeyFile],
                              config_path=cfg.path, user_home=os.path.expanduser("~"),
                              homes_dirs=[cfg.state_dir / "homes", home.parent]),
        network=profile == "write")
    fsutil.write_atomic(codex_home / "config.toml", codex.config_toml(call).encode(), durable=False)
    schema_file = None
    if opts.schema is not None:
        schema_file = str(codex_home / "schema.json")
        fsutil.write_atomic(Path(schema_file), json.dumps(opts.schema).encode(), durable=False)
    argv = codex.exec_argv(call, schema_file)
    if engine.sandbox == "bwrap":
        argv = codex.bwrap_argv(shutil.which("bwrap") or "bwrap", call, node) + argv
    env = codex.environment(bin_path=engine.bin, node=node, home=str(home / "home"), codex_home=str(codex_home),
                            bearer=magent.bearer, parent_env=os.environ)
    stream = codex.CodexStream()
    rec.stream = stream

    def on_line(line: bytes) -> bool:
        transcript.append(line)
        stream.feed(parse_json_line(line))
        return stream.completed or stream.failed is not None

    res = None
    try:
        with trio.move_on_after(opts.timeout_ms / 1000) as deadline:
            with kill_scope:
                res = await run_cli(argv, env=env, cwd=cwd, stdin_path=rec.dir / "prompt.txt", record=record,
                                    record_extra={"runId": live.run.id, "n": rec.n}, on_line=on_line,
                                    idle_timeout=cfg.agentIdleTimeoutMs / 1000)
    finally:
        meter.unregister(magent)
        transcript.close()
        shutil.rmtree(home, ignore_errors=True)
    if res is not None:
        rec.exit_code = res.exit_code
    if stop:
        return metered_verdict(magent, stream, codex.CodexVerdict(ok=False, error=stop[0]))
    if deadline.cancelled_caught:
        return metered_verdict(magent, stream, codex.CodexVerdict(ok=False, error=f"timed out after {opts.timeout_ms} ms"))
    if res is not None and res.idle_timeout:
        return metered_verdict(magent, stream, codex.CodexVerdict(
            ok=False, error=f"no output for {cfg.agentIdleTimeoutMs} ms (idle watchdog); the agent was killed"))
    verdict = codex.judge(stream, opts.schema)
    if not verdict.ok and magent.error:
        verdict = codex.CodexVerdict(ok=False, error=f"{verdict.error} ({magent.error})")
    return metered_verdict(magent, stream, verdict)
