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
  then fails), so it lives under the daemon's state dir.
- `--output-schema` is sent to the model but not validated by the CLI: the daemon
  validates the final message itself.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

import attrs
import jsonschema

from ..prices import Tokens

METER_ENV = "SWARMBASE_METER_TOKEN"
WORKSPACE_SECRET_GLOBS = ["**/.env", "**/.env.*", "**/*.token", "**/*.key", "**/*.pem", "**/.netrc",
                          "**/.git-credentials", "**/credentials", "**/credentials.json"]
CREDENTIAL_DIRS = [".ssh", ".aws", ".gnupg", ".kube", ".docker", ".config/gcloud", ".azure", ".claude",
                   ".codex", ".config/gh", ".password-store"]


def codex_homes_dir(state_dir: Path) -> Path:
    """Where throwaway CODEX_HOMEs go: under the state dir, unless that is itself under the
    temp dir, where codex refuses its PATH aliases and, with a system bubblewrap, every
    sandboxed command fails ("execvp codex-linux-sandbox"). Then a per-state-dir folder in
    the user's cache is used instead."""
    import hashlib
    import tempfile
    real = os.path.realpath(state_dir)
    tmp_roots = {os.path.realpath(tempfile.gettempdir()), "/tmp", "/var/tmp"}
    if any(real == t or real.startswith(t.rstrip("/") + "/") for t in tmp_roots):
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        digest = hashlib.sha256(real.encode()).hexdigest()[:12]
        return Path(cache) / "swarmbase" / f"codex-homes-{digest}"
    return state_dir / "homes"


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
    deny: list[str]                  # exact paths (files or dirs) the sandbox may not read
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
    for path in dict.fromkeys(call.deny):
        lines.append(f"{toml_str(path)} = \"deny\"")
    for pattern in WORKSPACE_SECRET_GLOBS:
        lines.append(f"{toml_str(call.cwd.rstrip('/') + '/' + pattern)} = \"deny\"")
    lines += ["", f"[permissions.{name}.network]", f"enabled = {'true' if call.network else 'false'}", ""]
    return "\n".join(lines)


def deny_paths(*, state_dir: Path, own_home: Path, key_files: list[str], config_path: Path,
               user_home: str, homes_dirs: list[Path] | None = None) -> list[str]:
    """What a codex agent's sandbox must not read, enumerated as exact paths now (deny globs
    with a `*` directory component are expanded differently between CLI versions)."""
    out: list[str] = [str(config_path)]
    out += [p for p in key_files if p]
    out += [str(p) for p in sorted(state_dir.glob("mcpl-*.token"))]
    out += [str(p) for p in sorted(state_dir.glob("*.key"))]
    for name in ("outbox.json", "outbox.jsonl", "procs"):
        out.append(str(state_dir / name))
    runs = state_dir / "runs"
    if runs.is_dir():
        for d in sorted(runs.iterdir()):
            for item in ("run.json", "script.js", "journal.jsonl", "log.jsonl", "result.json", "phases.json",
                         "agents"):
                if (d / item).exists():
                    out.append(str(d / item))
    for homes in homes_dirs or [state_dir / "homes"]:
        if homes.is_dir():
            for h in sorted(homes.iterdir()):
                if h != own_home:
                    out.append(str(h))
    out += [os.path.join(user_home, d) for d in CREDENTIAL_DIRS if os.path.exists(os.path.join(user_home, d))]
    return out


def exec_argv(call: CodexCall, schema_file: str | None) -> list[str]:
    argv = [call.bin, "exec", "--json", "--skip-git-repo-check", "--ephemeral", "--ignore-rules",
            "--strict-config", "-C", call.cwd]
    if schema_file:
        argv += ["--output-schema", schema_file]
    argv.append("-")                      # the prompt comes on stdin, from a file
    return argv


def npm_tree(bin_path: str) -> str | None:
    """For an npm-installed CLI (…/node_modules/.bin/codex → …/@openai/codex/bin/codex.js)
    the whole node_modules tree: the wrapper loads its platform package from a sibling."""
    real = os.path.realpath(bin_path)
    parts = real.split(os.sep)
    if "node_modules" in parts:
        i = len(parts) - 1 - parts[::-1].index("node_modules")
        return os.sep.join(parts[: i + 1])
    return None


def bwrap_argv(bwrap: str, call: CodexCall, node: str | None) -> list[str]:
    """The outer allow-list: system dirs, a few /etc files, the cwd (read-only unless write),
    the agent's CODEX_HOME, the dirs of the codex bin and of node, and an npm CLI's tree.
    It shares the host network (the CLI must reach the meter)."""
    argv = [bwrap, "--die-with-parent", "--unshare-pid", "--new-session",
            "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for d in ("bin", "sbin", "lib", "lib64", "lib32"):
        p = "/" + d
        if os.path.islink(p):
            argv += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            argv += ["--ro-bind", p, p]
    for f in ("/etc/hosts", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/resolv.conf",
              "/etc/localtime", "/etc/ssl", "/etc/ca-certificates", "/etc/alternatives"):
        argv += ["--ro-bind-try", f, f]
    mounts = [os.path.dirname(os.path.realpath(call.bin)), os.path.dirname(os.path.abspath(call.bin))]
    if node:
        mounts.append(os.path.dirname(os.path.realpath(node)))
    tree = npm_tree(call.bin)
    if tree:
        mounts.append(tree)
    for m in dict.fromkeys(mounts):
        if not m.startswith("/usr/") and m != "/usr":
            argv += ["--ro-bind", m, m]
    argv += ["--bind", call.codex_home, call.codex_home]
    argv += ["--bind" if call.profile == "write" else "--ro-bind", call.cwd, call.cwd]
    argv += ["--chdir", call.cwd, "--"]
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


def judge(stream: CodexStream, schema: dict[str, Any] | None) -> CodexVerdict:
    if stream.failed:
        return CodexVerdict(ok=False, error=f"turn failed: {stream.failed}")
    if not stream.completed:
        detail = f": {stream.errors[-1]}" if stream.errors else ""
        return CodexVerdict(ok=False, error="the agent ended without completing its turn" + detail)
    text = stream.last_text or ""
    if schema is None:
        return CodexVerdict(ok=True, value=text)
    try:
        value = json.loads(text)
    except ValueError:
        return CodexVerdict(ok=False, error="structured output is not JSON (the CLI does not validate it)")
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        return CodexVerdict(ok=False, error=f"structured output does not match the schema at {where}: {e.message}")
    return CodexVerdict(ok=True, value=value)
