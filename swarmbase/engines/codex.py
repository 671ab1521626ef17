"""The codex engine: CODEX_HOME config, argv (optionally inside bubblewrap), environment,
and reading `codex exec --json`. Pure functions; facts are from the team's codex-cli
notes and were re-checked against codex-cli 0.169 in this repo's tests:

- The provider points at the meter on loopback (`base_url` = the meter, so requests go to
  `<meter>/responses`); the per-agent meter bearer comes from an env var (`env_key`), so
  no config file ever holds a credential.
- A named permission profile (`default_permissions`) with deny entries confines the
  CLI's own sandbox; `-s` is never passed (it silently replaces the profile). Deny globs
  with `**` need `glob_scan_max_depth` in the profile.
- Tools off in every profile: sub-agents (`agents.enabled`), goals, image viewing.
  `request_user_input` has no switch in 0.169 but is refused in exec mode by the CLI
  itself. think also turns the shell off (`features.shell_tool`, `features.unified_exec`)
  and web search; its profile is read-only, so apply_patch cannot write either.
- CODEX_HOME must not be under /tmp (with a system bubblewrap every sandboxed command
  then fails): inside the sandbox the private dir is mounted outside any temp dir, and
  without the sandbox the config refuses a homesDir under the temp dir.
- `--output-schema` is sent to the model but not validated by the CLI: the daemon
  validates the final message itself.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import attrs
import jsonschema

from .. import json_depth
from ..prices import Tokens

METER_ENV = "SWARMBASE_METER_TOKEN"
WORKSPACE_SECRET_GLOBS = ["**/.env", "**/.env.*", "**/*.token", "**/*.key", "**/*.pem", "**/.netrc",
                          "**/.git-credentials", "**/credentials", "**/credentials.json"]
CREDENTIAL_DIRS = [".ssh", ".aws", ".gnupg", ".kube", ".docker", ".config/gcloud", ".azure", ".claude",
                   ".codex", ".config/gh", ".password-store"]


def toml_str(s: str) -> str:
    return json.dumps(s)   # a JSON string is a valid TOML basic string


@attrs.frozen
class CodexCall:
    bin: str
    cwd: str
    codex_home: str
    profile: str
    model: str | None
    effort: str | None
    meter_url: str
    deny: Sequence[str]              # exact paths (files or dirs) the sandbox may not read
    network: bool = False


def config_toml(call: CodexCall) -> str:
    name = f"swarm-{call.profile}"
    lines = []
    if call.model:
        lines.append(f"model = {toml_str(call.model)}")
    lines += [
        'model_provider = "swarmbase-meter"',
        f"default_permissions = {toml_str(name)}",
    ]
    if call.effort:
        lines.append(f"model_reasoning_effort = {toml_str('xhigh' if call.effort == 'max' else call.effort)}")
    if call.profile == "think":
        lines.append('web_search = "disabled"')
    lines += [
        "",
        "[model_providers.swarmbase-meter]",
        'name = "SwarmBase meter"',
        f"base_url = {toml_str(call.meter_url)}",
        'wire_api = "responses"',
        f"env_key = {toml_str(METER_ENV)}",
        "request_max_retries = 1",
        "stream_max_retries = 1",
        "",
        "[agents]",
        "enabled = false",
        "",
        "[features]",
        "goals = false",
        "view_image = false",
    ]
    if call.profile == "think":
        lines += ["shell_tool = false", "unified_exec = false"]
    lines += ["", f"[permissions.{name}.filesystem]", "glob_scan_max_depth = 8", '":root" = "read"']
    if call.profile == "write":
        lines.append('":workspace_roots" = "write"')
    if call.deny:
        lines.append(deny_lines(call.deny))
    for pattern in WORKSPACE_SECRET_GLOBS:
        lines.append(f"{toml_str(call.cwd.rstrip('/') + '/' + pattern)} = \"deny\"")
    lines += ["", f"[permissions.{name}.network]", f"enabled = {'true' if call.network else 'false'}", ""]
    return "\n".join(lines)


_rendered: list[Any] = [None, ""]          # the last deny sequence rendered, and its TOML


def deny_lines(deny: Sequence[str]) -> str:
    """The deny entries as TOML lines (one string). The daemon hands every agent the same
    maintained tuple until a run is added, so the last rendering is reused by identity
    (hashing 70,000 paths per agent would cost what the cache saves)."""
    if deny is not _rendered[0]:
        _rendered[:] = [deny, "\n".join(f"{toml_str(path)} = \"deny\"" for path in dict.fromkeys(deny))]
    return _rendered[1]


def exec_argv(call: CodexCall, schema_file: str | None) -> list[str]:
    argv = [call.bin, "exec", "--json", "--skip-git-repo-check", "--ephemeral", "--ignore-rules",
            "--strict-config", "-C", call.cwd]
    if schema_file:
        argv += ["--output-schema", schema_file]
    argv.append("-")                      # the prompt comes on stdin, from a file
    return argv


def environment(*, bin_path: str, node: str | None, home: str, codex_home: str, bearer: str,
                parent_env: Mapping[str, str]) -> dict[str, str]:
    """An allowlist: the codex wrapper needs node on PATH; the CLI needs CODEX_HOME and the
    meter bearer. The caller's gateway token never enters it (the meter holds it)."""
    dirs = [os.path.dirname(bin_path)] + ([os.path.dirname(node)] if node else []) + \
        ["/usr/local/bin", "/usr/bin", "/bin"]
    env = {"PATH": ":".join(dict.fromkeys(dirs)), "HOME": home, "CODEX_HOME": codex_home,
           METER_ENV: bearer, "LANG": parent_env.get("LANG", "C.UTF-8")}
    for k in ("LC_ALL", "TZ"):
        if k in parent_env:
            env[k] = parent_env[k]
    return env


# ---------------------------------------------------------------------------
# Reading `codex exec --json`.

@attrs.define
class CodexStream:
    last_text: str | None = None
    turn_usage: Tokens | None = None
    completed: bool = False
    failed: str | None = None
    errors: list[str] = attrs.Factory(list)

    def feed(self, event: Any) -> None:
        if not isinstance(event, dict):
            return
        t = event.get("type")
        if t == "item.completed":
            item = event.get("item") or {}
            if item.get("type") == "agent_message" and isinstance(item.get("text"), str):
                self.last_text = item["text"]
            elif item.get("type") == "error":
                self.errors.append(str(item.get("message", ""))[:500])
        elif t == "turn.completed":
            u = event.get("usage") or {}
            cached = int(u.get("cached_input_tokens") or 0)
            self.turn_usage = Tokens(input=max(0, int(u.get("input_tokens") or 0) - cached),
                                     output=int(u.get("output_tokens") or 0), cache_read=cached)
            self.completed = True
        elif t == "turn.failed":
            self.failed = str((event.get("error") or {}).get("message") or "turn failed")[:2000]
        elif t == "error":
            self.errors.append(str(event.get("message", ""))[:500])


@attrs.frozen
class CodexVerdict:
    ok: bool
    value: Any = None
    error: str | None = None
    text: str | None = None
    schema_error: str | None = None


def judge(stream: CodexStream, schema: dict[str, Any] | None) -> CodexVerdict:
    if stream.failed:
        return CodexVerdict(ok=False, error=f"turn failed: {stream.failed}")
    if not stream.completed:
        detail = f": {stream.errors[-1]}" if stream.errors else ""
        return CodexVerdict(ok=False, error="the agent ended without completing its turn" + detail)
    text = stream.last_text or ""
    if schema is None:
        return CodexVerdict(ok=True, value=text, text=text)
    try:
        value = json_depth.loads(text)
    except json_depth.TooDeep:
        return CodexVerdict(ok=False, text=text[:10_000], error=(
            f"the structured output nests deeper than {json_depth.MAX_DEPTH} levels (the limit)"))
    except ValueError:
        msg = "structured output is not JSON (the CLI does not validate it)"
        return CodexVerdict(ok=False, error=msg, schema_error=msg, text=text)
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        msg = f"structured output does not match the schema at {where}: {e.message}"
        return CodexVerdict(ok=False, error=msg, schema_error=msg, text=text)
    return CodexVerdict(ok=True, value=value, text=text)


# ---------------------------------------------------------------------------
# What the CLI's own sandbox must not read (defense in depth; with the outer sandbox
# none of it exists in the agent's namespace anyway).

RUN_ITEMS = ("run.json", "script.js", "journal.jsonl", "log.jsonl", "result.json", "phases.json", "agents")


def secret_paths(state_dir: Path, key_files: list[str], config_path: Path, user_home: str) -> list[str]:
    """The daemon's secrets and records outside runs/: fixed at start-up."""
    out = [str(config_path), *[p for p in key_files if p]]
    out += [str(p) for p in sorted(state_dir.glob("mcpl-*.token"))]
    out += [str(p) for p in sorted(state_dir.glob("*.key"))]
    out += [str(state_dir / n) for n in ("outbox.json", "outbox.jsonl", "procs", "admin", "runs-archive")]
    out += [os.path.join(user_home, d) for d in CREDENTIAL_DIRS if os.path.exists(os.path.join(user_home, d))]
    return out


def run_paths(run_dir: Path) -> list[str]:
    """One run's records (never its work dir, which may be an agent's cwd)."""
    return [str(run_dir / item) for item in RUN_ITEMS]
