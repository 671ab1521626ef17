"""The claude engine: argv and environment for one `claude -p`, and reading its stream-json.

Pure functions; the process itself is run by engines/process.py. Facts behind the flags
are in the team's claude-cli notes (Claude Code 2.1.x):
- stream-json needs --verbose; stdin must not be an open pipe (a hang cause), so the
  prompt is given as a regular file on stdin, which also keeps it out of argv and lifts
  the 128 KiB argv limit.
- --permission-mode dontAsk denies whatever is not allowed; rules are path-scoped
  because a bare Read allow reaches outside the cwd; writes need Edit(...) (Write(...)
  did not allow a Write).
- the `result` event's is_error is the real failure flag (subtype lies), budget stops
  have no `result` text, and `usage` is wrong on budget stops: cost and tokens come from
  total_cost_usd and modelUsage.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import attrs
import jsonschema

from ..jsonvalue import list_at, object_at
from .. import json_depth
from ..prices import Tokens
from .base import TOO_DEEP
from . import framing
from .verdict import Verdict

PROFILE_TOOLS = {
    "think": [],
    "read": ["Read", "Grep", "Glob", "WebFetch", "WebSearch"],
    "write": ["Read", "Grep", "Glob", "WebFetch", "WebSearch", "Edit", "Write", "Bash"],
}

CREDENTIAL_DIRS = [".ssh", ".aws", ".gnupg", ".kube", ".docker", ".config/gcloud", ".azure",
                   ".claude", ".codex", ".config/gh", ".password-store"]
CREDENTIAL_FILES = ["**/.env", "**/.env.*", "**/*.token", "**/*.key", "**/*.pem", "**/.netrc",
                    "**/.git-credentials", "**/.npmrc", "**/.pypirc", "**/credentials", "**/credentials.json"]


def abs_rule(tool: str, path: str) -> str:
    """`Tool(//abs/path/**)`: `//` starts an absolute path in Claude Code rules."""
    return f"{tool}(/{path.rstrip('/')}/**)"


def deny_rules(state_dir: str, user_home: str, secret_files: list[str]) -> list[str]:
    rules = []
    for tool in ("Read", "Edit"):
        for d in CREDENTIAL_DIRS:
            rules.append(abs_rule(tool, os.path.join(user_home, d)))
        rules += [f"{tool}({pat})" for pat in CREDENTIAL_FILES]
        # The daemon's own records and secrets (never the work dirs agents run in).
        for pat in ("*.json", "*.json.*", "*.key", "*.token", "procs/**", "homes/**",
                    "runs/*/agents/**", "runs/*/*.json", "runs/*/*.jsonl", "runs/*/script.js"):
            rules.append(f"{tool}(/{state_dir.rstrip('/')}/{pat})")
        rules += [f"{tool}(/{p})" for p in secret_files]
    return rules


@attrs.frozen
class ClaudeCall:
    bin: str
    cwd: str
    profile: str
    model: str | None
    effort: str | None
    schema: dict[str, Any] | None
    max_usd: float
    state_dir: str
    user_home: str
    secret_files: list[str] = attrs.field(factory=list)
    disallowed: list[str] = attrs.field(factory=list)     # agent({disallowedTools})
    # A project agent type's body, as a file (its size is not bound by argv's 128 KiB): it
    # replaces the CLI's default system prompt, as Claude Code's subagents of that type get.
    system_prompt_file: str | None = None


def argv(call: ClaudeCall) -> list[str]:
    # A disallowed tool is not offered at all (removed from --tools) and denied by name too,
    # as Claude Code's runtime passes it to its subagents.
    tools = [t for t in PROFILE_TOOLS[call.profile] if t not in call.disallowed]
    allow: list[str] = []
    if call.profile in ("read", "write"):
        allow += [abs_rule("Read", call.cwd), "WebFetch", "WebSearch"]
    if call.profile == "write":
        allow += [abs_rule("Edit", call.cwd), "Bash"]
    allow = [a for a in allow if a.split("(")[0] in tools]
    settings = {"permissions": {"deny": deny_rules(call.state_dir, call.user_home, call.secret_files)}}
    out = [call.bin, "-p", "--output-format", "stream-json", "--verbose", "--include-partial-messages",
           "--permission-mode", "dontAsk", "--setting-sources=",
           "--settings", json.dumps(settings, separators=(",", ":")),
           "--strict-mcp-config", "--mcp-config", '{"mcpServers":{}}',
           "--no-session-persistence",
           f"--tools={','.join(tools)}",
           "--max-budget-usd", f"{call.max_usd:.4f}"]
    if allow:
        out += ["--allowedTools", ",".join(allow)]
    if call.disallowed:
        out += [f"--disallowedTools={','.join(call.disallowed)}"]     # one word: a value never reads as a flag
    if call.model:
        out += ["--model", call.model]
    if call.effort:
        out += ["--effort", call.effort]
    if call.schema is not None:
        out += ["--json-schema", json.dumps(call.schema, separators=(",", ":"))]
    # The agent is told its final message is the script's return value (engines/framing.py).
    if call.system_prompt_file is not None:
        out += ["--system-prompt-file", call.system_prompt_file]
    out += ["--append-system-prompt", framing.note(call.schema is not None)]
    return out


def header_safe(text: str, limit: int = 120) -> str:
    """A header value that cannot smuggle in another header."""
    return "".join(ch for ch in text if 0x20 <= ord(ch) < 0x7F)[:limit]


def environment(*, bin_path: str, home: str, tmp: str, api_key: str | None, base_url: str | None,
                run_id: str, n: int, label: str, parent_env: Mapping[str, str],
                gateway: bool | None = None) -> dict[str, str]:
    """Built from an allowlist: nothing of the daemon's environment leaks but locale.
    `gateway`: whether the API is a configured baseUrl, which gets the x-gate-* headers
    (the vendor API does not); default: whether there is a base_url."""
    path_dirs = [os.path.dirname(bin_path), "/usr/local/bin", "/usr/bin", "/bin"]
    env = {
        "PATH": ":".join(dict.fromkeys(d for d in path_dirs if d)),
        "HOME": home,
        "CLAUDE_CONFIG_DIR": os.path.join(home, ".claude"),
        "TMPDIR": tmp,
        "CLAUDE_CODE_TMPDIR": tmp,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_MAX_RETRIES": "2",
        "LANG": parent_env.get("LANG", "C.UTF-8"),
    }
    for k in ("LC_ALL", "LC_CTYPE", "TZ"):
        if k in parent_env:
            env[k] = parent_env[k]
    if api_key:
        env["ANTHROPIC_API_KEY"] = api_key
    if base_url:
        env["ANTHROPIC_BASE_URL"] = base_url
    if base_url if gateway is None else gateway:
        env["ANTHROPIC_CUSTOM_HEADERS"] = "\n".join([
            "x-gate-origin: swarmbase", f"x-gate-channel: {header_safe(run_id)}",
            f"x-gate-counterparty: {n}:{header_safe(label)}"])
    return env


# ---------------------------------------------------------------------------
# Reading the stream.

def _usage_tokens(u: Mapping[str, Any]) -> Tokens:
    def g(*keys: str) -> int:
        for k in keys:
            v = u.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return int(v)
        return 0
    return Tokens(input=g("input_tokens", "inputTokens"), output=g("output_tokens", "outputTokens"),
                  cache_read=g("cache_read_input_tokens", "cacheReadInputTokens"),
                  cache_write=g("cache_creation_input_tokens", "cacheCreationInputTokens"))


@attrs.define
class StreamState:
    """What has been learnt from the stream so far.

    With --include-partial-messages the CLI relays the API's stream events: each
    message_start carries the request's input usage, text deltas show output growing, and
    message_delta the message's final output count, so usage is live and a killed agent
    is charged for what it really used. Without them (older CLIs, fakes), the assistant
    events' message_start usage is the fallback (output ≈ 1 there: an underestimate)."""
    result: dict[str, Any] | None = None
    # message id -> usage seen on its assistant events
    streamed: dict[str, Tokens] = attrs.Factory(dict)
    finished: list[Tokens] = attrs.Factory(list)      # from stream events, per message
    current: Tokens | None = None                     # the message streaming now
    current_chars: int = 0
    model: str | None = None
    last_text: str | None = None
    api_errors: list[str] = attrs.Factory(list)
    partial: bool = False                             # stream events seen
    too_deep: int = 0                                 # lines refused for their nesting

    def feed(self, event: Any) -> None:
        if event is TOO_DEEP:
            self.too_deep += 1
            return
        if not isinstance(event, dict):
            return
        t = event.get("type")
        if t == "stream_event":
            self._feed_stream_event(event.get("event"))
        elif t == "system" and event.get("subtype") == "init":
            self.model = event.get("model") if isinstance(event.get("model"), str) else self.model
        elif t == "assistant":
            msg = object_at(event, "message")
            if event.get("is_api_error_message") or event.get("error"):
                self.api_errors.append(str(event.get("error") or "api error"))
            mid = msg.get("id")
            if isinstance(mid, str) and isinstance(msg.get("usage"), dict):
                self.streamed[mid] = _usage_tokens(msg["usage"])
            for block in msg.get("content") or []:
                if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
                    self.last_text = block["text"]
        elif t == "result":
            self.result = event

    def _feed_stream_event(self, ev: Any) -> None:
        if not isinstance(ev, dict):
            return
        self.partial = True
        kind = ev.get("type")
        if kind == "message_start":
            self._close_current()
            msg = object_at(ev, "message")
            self.current = _usage_tokens(msg.get("usage") or {})
            self.current_chars = 0
        elif kind == "content_block_delta" and self.current is not None:
            delta = object_at(ev, "delta")
            for k in ("text", "partial_json", "thinking"):
                if isinstance(delta.get(k), str):
                    self.current_chars += len(delta[k])
        elif kind == "message_delta" and self.current is not None:
            usage = object_at(ev, "usage")
            out = usage.get("output_tokens")
            if isinstance(out, int) and not isinstance(out, bool):
                self.current = attrs.evolve(self.current, output=out)
                self.current_chars = 0
        elif kind == "message_stop":
            self._close_current()

    def _close_current(self) -> None:
        if self.current is not None:
            self.finished.append(self._with_estimate(self.current))
            self.current = None
            self.current_chars = 0

    def _with_estimate(self, t: Tokens) -> Tokens:
        return attrs.evolve(t, output=max(t.output, self.current_chars // 4))

    @property
    def responses(self) -> int:
        return len(self.finished) + (self.current is not None) if self.partial else len(self.streamed)

    @property
    def streamed_tokens(self) -> Tokens:
        total = Tokens()
        if self.partial:
            for t in self.finished:
                total = total + t
            if self.current is not None:
                total = total + self._with_estimate(self.current)
            return total
        for t in self.streamed.values():
            total = total + t
        return total


def result_tokens(result: Mapping[str, Any]) -> Tokens | None:
    mu = result.get("modelUsage")
    if isinstance(mu, dict) and mu:
        total = Tokens()
        for row in mu.values():
            if isinstance(row, dict):
                total = total + _usage_tokens(row)
        return total
    if isinstance(result.get("usage"), dict):
        return _usage_tokens(result["usage"])
    return None


def judge(state: StreamState, schema: dict[str, Any] | None) -> Verdict:
    """Classify a finished (or killed) agent from its stream."""
    r = state.result
    if r is None:
        tokens = state.streamed_tokens
        error = "the agent ended without a result (crash, kill or hang)"
        if state.too_deep:
            error = (f"the CLI's output nested deeper than {json_depth.MAX_DEPTH} levels (the limit for a "
                     f"model's answer) and was refused")
        return Verdict(ok=False, error=error, tokens=tokens, cost_usd=0.0 if state.responses == 0 else None,
                       tokens_exact=state.responses == 0)
    tokens = result_tokens(r) or state.streamed_tokens
    raw_cost = r.get("total_cost_usd")
    cost = float(raw_cost) if isinstance(raw_cost, (int, float)) and not isinstance(raw_cost, bool) else None
    if cost is not None and cost <= 0 and tokens.total > 0:
        cost = None          # a zero cost with real usage is a parsing gap, not free work
    exact = result_tokens(r) is not None
    if r.get("is_error"):
        errors = list_at(r, "errors")
        reason = r.get("terminal_reason") or r.get("subtype") or "error"
        detail = "; ".join(str(e) for e in errors) or str(r.get("result") or "")
        status = r.get("api_error_status")
        msg = f"{reason}" + (f" (HTTP {status})" if status else "") + (f": {detail}" if detail else "")
        if "budget" in str(r.get("subtype") or reason):
            msg += " (the agent reached its USD cap; opts.maxUsd lifts it, default budgetUsd / perRunConcurrency)"
        return Verdict(ok=False, error=msg[:2000], cost_usd=cost, tokens=tokens, tokens_exact=exact)
    if schema is not None:
        value = r.get("structured_output")
        if value is None:
            msg = "no structured output: the agent never produced an object matching the schema"
            return Verdict(ok=False, error=msg, schema_error=msg, text=state.last_text,
                           cost_usd=cost, tokens=tokens, tokens_exact=exact)
        if json_depth.deeper_than(value, json_depth.MAX_DEPTH):
            # Refused before jsonschema walks it (recursively: ~4 frames a level).
            msg = f"the structured output nests deeper than {json_depth.MAX_DEPTH} levels (the limit)"
            return Verdict(ok=False, error=msg, cost_usd=cost, tokens=tokens, tokens_exact=exact)
        try:
            jsonschema.validate(value, schema)
        except jsonschema.ValidationError as e:
            path = "/".join(str(p) for p in e.absolute_path) or "(root)"
            msg = f"structured output does not match the schema at {path}: {e.message}"
            return Verdict(ok=False, error=msg, schema_error=msg, text=json.dumps(value),
                           cost_usd=cost, tokens=tokens, tokens_exact=exact)
        return Verdict(ok=True, value=value, text=json.dumps(value), cost_usd=cost, tokens=tokens, tokens_exact=exact)
    text = r.get("result")
    if not isinstance(text, str):
        text = state.last_text or ""
    return Verdict(ok=True, value=text, text=text, cost_usd=cost, tokens=tokens, tokens_exact=exact)
