"""The codex engine: one `codex exec --json` per agent, its requests through the meter.

Its private dir holds HOME and a throwaway CODEX_HOME (config.toml with the permission
profile and the provider pointing at the meter, the schema file). The CLI authenticates
to the meter with a per-agent bearer; the caller's gateway token stays in the daemon. Its
network reaches the meter only (a write agent: the caller's `network` hosts too), so the
CLI's shell reaches neither the gateway directly nor anything else on the host.
Usage comes from the meter as responses stream; the price row is the model's own (no row:
$0, the token budget bounds it).
"""

from __future__ import annotations

import json
import os
import shutil
from functools import partial
from typing import Any, Callable, Mapping, Sequence

import trio

from .. import prices
from ..config import Caller, Config
from ..launch.egress import url_endpoint
from ..launch.spec import AGENT_DIR, LaunchSpec
from ..prices import Tokens
from ..launch.sandbox import interpreter_paths
from . import codex, framing
from .base import AgentIO, AgentJob, EngineBase, parse_json_line, spawn_failure
from .meter import Meter, MeterAgent
from .strict_schema import strict
from .verdict import Verdict

MAX_SCHEMA_BYTES = 1024 * 1024     # the schema is a file in the agent's private dir


def effective_profile(profile: str, confined: bool, max_profile: str) -> str:
    """Without the outer sandbox an unwrapped shell reads whatever the deny-list misses, so
    read/write are for callers trusted with write only; everyone else gets think."""
    if not confined and max_profile != "write":
        return "think"
    return profile


class CodexEngine(EngineBase):
    name = "codex"
    max_schema_bytes = MAX_SCHEMA_BYTES
    local_only = "a codex agent's requests go through the daemon's usage meter on loopback"

    def __init__(self, cfg: Config, meter: Meter, deny: Callable[[], Sequence[str]],
                 parent_env: Mapping[str, str] | None = None) -> None:
        self.cfg = cfg
        self.meter = meter
        self.deny = deny                      # the maintained deny list (used without the sandbox)
        self.parent_env = dict(os.environ if parent_env is None else parent_env)
        self.node = shutil.which("node")

    def default_model(self, caller: Caller, run_model: str | None, phase_model: str | None) -> str | None:
        """The caller's codex model, else the engine's (a run's model and phases' models are
        Claude models)."""
        cx = self.cfg.engines.codex
        return caller.defaultModels.codex or (cx.defaultModel if cx else None)

    def token_budget(self, asked: int | None) -> int | None:
        cx = self.cfg.engines.codex
        assert cx is not None
        return min(asked or cx.maxTokensDefault, cx.maxTokensMax)

    def prepare_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        """OpenAI's strict structured outputs (StrictSchemaError, a SchemaRefused, if it cannot be)."""
        return strict(schema)

    def price(self, model: str | None) -> prices.PriceRow | None:
        return prices.row_for(model, self.cfg.prices, engine="codex")

    def spec(self, job: AgentJob, bearer: str, profile: str, confined: bool) -> LaunchSpec:
        engine = self.cfg.engines.codex
        assert engine is not None
        call = codex.CodexCall(bin=engine.bin, cwd=job.cwd, codex_home=f"{AGENT_DIR}/codex-home", profile=profile,
                               model=job.model, effort=job.effort, meter_url=self.meter.url,
                               deny=[] if confined else self.deny(), network=profile == "write")
        prompt = framing.framed_prompt(job.prompt, job.schema is not None, job.system_prompt)
        files = {"codex-home/config.toml": codex.config_toml(call).encode(), "prompt.txt": prompt.encode()}
        schema_file = None
        if job.schema is not None:
            files["schema.json"] = json.dumps(job.schema).encode()
            schema_file = f"{AGENT_DIR}/schema.json"
        env = codex.environment(bin_path=engine.bin, node=self.node, home=f"{AGENT_DIR}/home",
                                codex_home=f"{AGENT_DIR}/codex-home", bearer=bearer, parent_env=self.parent_env)
        read = [job.cwd, *job.extra_read, *interpreter_paths(engine.bin, env["PATH"])]
        if self.node:
            read.append(os.path.dirname(os.path.realpath(self.node)))
        return LaunchSpec(argv=tuple(codex.exec_argv(call, schema_file)), env=env, cwd=job.cwd, key=job.key,
                          owner=job.caller,
                          files=files, dirs=("home", "tmp", "codex-home"), stdin_file="prompt.txt",
                          read=tuple(read), write=(job.cwd, *job.extra_write) if profile == "write" else (),
                          network=True, egress=job.egress(url_endpoint(self.meter.url), profile),
                          idle_timeout=self.cfg.agentIdleTimeoutMs / 1000, state_dirs=job.state_dirs,
                          cwd_roots=job.cwd_roots, caller_paths=job.caller_paths, nesting=True,
                          record={"runId": job.run_id, "n": job.n, "engine": "codex"})

    async def run(self, job: AgentJob, io: AgentIO) -> Verdict:
        engine = self.cfg.engines.codex
        assert engine is not None and engine.baseUrl
        if not os.access(engine.bin, os.X_OK):
            return spawn_failure("codex", engine.bin, "the executable is missing (engines.codex.bin)")
        confined = io.launcher.confined
        profile = effective_profile(job.profile, confined, job.caller_max_profile)
        price = self.price(job.model)
        io.usage.priced = price is not None
        stop: list[str] = []
        kill_scope = trio.CancelScope()

        def kill(reason: str) -> None:
            stop.append(reason)
            kill_scope.cancel()

        magent: MeterAgent

        def changed() -> None:
            io.usage.tokens = magent.live
            io.usage.responses = magent.responses + (1 if magent.pending.total else 0)
            io.usage.cost_usd = magent.cost(magent.live)
            io.usage_changed()

        magent = self.meter.register(run_id=job.run_id, n=job.n, label=job.label, gateway_token=job.api_key,
                                     upstream=engine.baseUrl.rstrip("/"), max_tokens=job.max_tokens,
                                     max_usd=job.max_usd if price is not None else None, price=price, kill=kill,
                                     changed=changed)
        stream = codex.CodexStream()

        def on_line(line: bytes) -> bool:
            io.transcript(line)
            stream.feed(parse_json_line(line))
            return stream.completed or stream.failed is not None

        res = None
        try:
            with kill_scope:
                res = await io.launcher.run(self.spec(job, magent.bearer, profile, confined), on_line, io.started)
        finally:
            # A response cut off by a kill never reports usage: charge the meter's estimate
            # of it (marked), never zero.
            cut = magent.pending
            self.meter.unregister(magent)
            io.usage.tokens = settled_tokens(magent, stream) + cut
            io.usage.cost_usd = magent.cost(io.usage.tokens)
            io.usage.exact = stream.completed and not magent.estimated and not cut.total
        if res is not None and res.spawn_error:
            return spawn_failure("codex", engine.bin, res.spawn_error)
        verdict = partial(Verdict, cost_usd=io.usage.cost_usd, tokens=io.usage.tokens, tokens_exact=io.usage.exact,
                          exit_code=res.exit_code if res else None)
        if stop:
            return verdict(ok=False, error=stop[0])
        if res is not None and res.idle_timeout:
            return verdict(ok=False, error=(f"no output for {self.cfg.agentIdleTimeoutMs} ms (idle watchdog); "
                                            "the agent was killed"))
        v = codex.judge(stream, job.schema)
        error = v.error
        if not v.ok and magent.error:
            error = f"{v.error} ({magent.error})"
        return verdict(ok=v.ok, value=v.value, error=error, text=v.text, schema_error=v.schema_error)


def settled_tokens(magent: MeterAgent, stream: codex.CodexStream) -> Tokens:
    """Tokens from the meter; the CLI's turn.completed count when the meter could not read
    a response's usage."""
    tokens = magent.used
    if magent.unparsed and stream.turn_usage is not None and stream.turn_usage.total > tokens.total:
        tokens = stream.turn_usage
    return tokens
