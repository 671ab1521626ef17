"""The claude engine: one `claude -p` per agent, launched through the launcher.

The prompt is a file in the agent's private dir given as stdin (never argv); the private
dir is its HOME, CLAUDE_CONFIG_DIR and TMPDIR. It reads its cwd (writes it only under the
write profile); its network reaches the key door (below) and, for a write agent, the
caller's `network` hosts. Usage is live from the relayed stream
events, priced from the model's row until the CLI's own cost report arrives.

The caller's key never enters an agent on this machine: the CLI gets a per-agent bearer
and the key door's URL (engines/key_door.py), which swaps the bearer for the key on the
way out; its network's one door to the API leads to the key door. An agent placed on
another machine (a Ray node, which cannot reach the daemon's loopback) gets the same from
a key door its node runs beside it (launch/spec.ModelKey, node/door.py): the key travels
only in the launch, to that door, with the bearer made here, so that the redactor knows
every agent's bearer while the agent lives, wherever it runs (issue 31 #3). What the
agent said is redacted before its bearer is dropped: its result is recorded after.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator, Mapping

import attrs


from .. import prices
from ..config import Caller, Config
from ..launch.egress import ANTHROPIC_API, url_endpoint
from ..launch.spec import AGENT_DIR, KEY_DOOR_BEARER, KEY_DOOR_URL, LaunchSpec, ModelKey
from ..launch.sandbox import interpreter_paths
from . import claude
from .bearer_relay import Redacts, new_bearer
from .key_door import KeyDoor
from .base import AgentIO, AgentJob, EngineBase, parse_json_line, spawn_failure
from .verdict import Verdict, scrubbed

SCHEMA_ARG_LIMIT = 64 * 1024      # --json-schema takes inline JSON only (verified on 2.1.328)
CLI_DEFAULT_MODEL = "claude-opus-5-5"  # what `claude -p` uses without --model (notes: 2.1.x)
SYSTEM_PROMPT_FILE = "system-prompt.md"   # a project agent type's body, in the private dir


class ClaudeEngine(EngineBase):
    name = "claude"
    max_schema_bytes = SCHEMA_ARG_LIMIT
    cli_default_model = CLI_DEFAULT_MODEL

    def __init__(self, cfg: Config, door: KeyDoor | None = None, parent_env: Mapping[str, str] | None = None,
                 redact: Redacts | None = None) -> None:
        self.cfg = cfg
        self.door = door
        self.parent_env = dict(os.environ if parent_env is None else parent_env)
        self.redact = redact          # the daemon's: agents' bearers are secrets while they live

    def default_model(self, caller: Caller, run_model: str | None, phase_model: str | None) -> str | None:
        """A declared phase's model (meta.phases[].model), else the run's, else the caller's."""
        return phase_model or run_model or caller.defaultModels.claude

    def price(self, model: str | None) -> prices.PriceRow | None:
        return prices.row_for(model, self.cfg.prices)

    def spec(self, job: AgentJob, bearer: str | None = None, beside: bool = False) -> LaunchSpec:
        """The CLI's launch; with `bearer` (its key door's, for this agent) it holds that:
        `beside` (a launcher off this machine) the launcher's own key door holds it
        (launch/spec.ModelKey), else it reaches the API through the daemon's key door;
        without a bearer, the caller's key and the API (no key door: unit tests)."""
        engine = self.cfg.engines.claude
        assert engine is not None
        call = claude.ClaudeCall(bin=engine.bin, cwd=job.cwd, profile=job.profile, model=job.model,
                                 effort=job.effort, schema=job.schema, max_usd=job.max_usd,
                                 state_dir=str(self.cfg.state_dir), user_home=os.path.expanduser("~"),
                                 secret_files=list(job.secret_files), disallowed=list(job.disallowed_tools),
                                 system_prompt_file=f"{AGENT_DIR}/{SYSTEM_PROMPT_FILE}" if job.system_prompt else None)
        upstream, model_key = engine.baseUrl or ANTHROPIC_API, None
        key: str | None
        base_url: str | None
        if beside:
            if bearer is None:         # never the caller's key off this machine
                raise ValueError("an agent off this machine needs the bearer its key door holds")
            model_key = ModelKey(key=job.api_key, upstream=upstream, bearer=bearer)
            key, base_url = KEY_DOOR_BEARER, KEY_DOOR_URL
        elif bearer is not None and self.door is not None and self.door.url:
            key, base_url = bearer, self.door.url
        else:
            key, base_url = job.api_key, engine.baseUrl
        env = claude.environment(bin_path=engine.bin, home=f"{AGENT_DIR}/home", tmp=f"{AGENT_DIR}/tmp",
                                 api_key=key, base_url=base_url, run_id=job.run_id, n=job.n, label=job.label,
                                 parent_env=self.parent_env, gateway=engine.baseUrl is not None)
        search = env["PATH"]
        return LaunchSpec(argv=tuple(claude.argv(call)), env=env, cwd=job.cwd, key=job.key, owner=job.caller,
                          files={"prompt.txt": job.prompt.encode(),
                                 **({SYSTEM_PROMPT_FILE: job.system_prompt.encode()} if job.system_prompt else {})},
                          stdin_file="prompt.txt",
                          read=(job.cwd, *job.extra_read, *interpreter_paths(engine.bin, search)),
                          write=(job.cwd, *job.extra_write) if job.profile == "write" else (), network=True,
                          egress=job.egress(None if model_key else url_endpoint(base_url or upstream)),
                          model_key=model_key,
                          idle_timeout=self.cfg.agentIdleTimeoutMs / 1000, state_dirs=job.state_dirs,
                          cwd_roots=job.cwd_roots, caller_paths=job.caller_paths,
                          record={"runId": job.run_id, "n": job.n, "engine": "claude"})

    async def run(self, job: AgentJob, io: AgentIO) -> Verdict:
        engine = self.cfg.engines.claude
        assert engine is not None
        if not os.access(engine.bin, os.X_OK):
            return spawn_failure("claude", engine.bin, "the executable is missing (engines.claude.bin)")
        row = self.price(job.model)
        state = claude.StreamState()
        io.usage.priced = row is not None

        def on_line(line: bytes) -> bool:
            event = parse_json_line(line)
            if not (isinstance(event, dict) and event.get("type") == "stream_event"):
                io.transcript(line)          # deltas are folded into the assistant events
            before = io.usage.tokens
            state.feed(event)
            tokens = state.streamed_tokens
            if tokens != before:
                io.usage.tokens = tokens
                io.usage.responses = state.responses
                io.usage.cost_usd = prices.cost(tokens, row) if row else 0.0
                io.usage_changed()
            return state.result is not None

        on_host = io.launcher.on_daemon_host
        with self._bearer(job.api_key, engine.baseUrl or ANTHROPIC_API, on_host) as bearer:
            spec = self.spec(job, bearer, beside=not on_host)
            res = await io.launcher.run(spec, on_line, io.started)
            if res.spawn_error:
                return spawn_failure("claude", engine.bin, res.spawn_error)
            verdict = claude.judge(state, job.schema)
            if bearer is not None and self.redact is not None:
                verdict = scrubbed(verdict, self.redact)
        if verdict.cost_usd is None and row is not None:
            verdict = attrs.evolve(verdict, cost_usd=prices.cost(verdict.tokens, row))
        io.usage.tokens, io.usage.cost_usd = verdict.tokens, verdict.cost_usd or 0.0
        io.usage.exact = verdict.tokens_exact and state.result is not None
        if res.error:                    # the launcher lost the process (e.g. its node died)
            return attrs.evolve(verdict, ok=False, value=None, error=res.error, exit_code=res.exit_code)
        if res.idle_timeout:
            return attrs.evolve(verdict, ok=False, value=None, error=(
                f"no output for {self.cfg.agentIdleTimeoutMs} ms (idle watchdog); the agent was killed"))
        return attrs.evolve(verdict, exit_code=res.exit_code)

    @contextmanager
    def _bearer(self, api_key: str, upstream: str, on_host: bool) -> Iterator[str | None]:
        """The agent's bearer, known to the redactor while it lives: the daemon's key
        door's (on this machine), or one made here for the key door its launcher runs
        beside it (a node's: a bearer the node made would be unknown here); None without
        a key door on this machine (the caller's key itself: unit tests)."""
        door = self.door if self.door is not None and self.door.url else None
        if on_host and door is None:
            yield None
        elif on_host and door is not None:
            held = door.register(api_key, upstream)
            try:
                yield held.bearer
            finally:
                door.unregister(held)
        else:
            bearer = new_bearer()
            if self.redact is not None:
                self.redact.add(bearer)
            try:
                yield bearer
            finally:
                if self.redact is not None:
                    self.redact.discard(bearer)
