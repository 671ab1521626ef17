"""The daemon's config: attrs classes, validated with key paths, structured with cattrs.

Each field carries its JSON key and limits in its metadata, so one declaration drives
validation (unknown keys, types, ranges) and structuring. Loading never half-succeeds:
a bad config raises ConfigError with one message naming the key path and the fault.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
import stat
import typing
from pathlib import Path
from typing import Any, Literal, Optional

import attrs

from . import identity, jsonc
from .config_schema import ConfigError, check_object, converter, type_name
from .config_schema import field as _f
from .launch import egress
from .runs.retention_rules import Retention, check as check_retention

PROFILES = ("think", "read", "write")
ENGINES: tuple[Literal["claude", "codex"], ...] = ("claude", "codex")
DEFAULT_ENGINE = ENGINES[0]      # an agent() without opts.engine, and the engine a run's `model` is for
PLACEMENTS: tuple[Literal["local", "ray"], ...] = ("local", "ray")


@attrs.frozen
class ClaudeEngine:
    bin: str = _f("bin", "claude")
    baseUrl: Optional[str] = _f("baseUrl", None)
    # think agents as one Messages API request made by the daemon (engines/think_run.py);
    # false: a `claude -p` each, e.g. for a subscription login the daemon cannot use.
    inProcessThink: bool = _f("inProcessThink", True)
    # read agents as the daemon's own model loop with Read/Grep/Glob run by a tool host in
    # the agent's sandbox (engines/read_run.py); false: a `claude -p` each (WebFetch and
    # WebSearch included). Write agents always run the CLI.
    inProcessRead: bool = _f("inProcessRead", True)
    readMaxTurns: int = _f("readMaxTurns", 100, lo=1, hi=10_000)   # model requests per in-daemon read agent


@attrs.frozen
class CodexEngine:
    bin: str = _f("bin", "codex")
    baseUrl: Optional[str] = _f("baseUrl", None)
    # Deprecated: the daemon-wide `sandbox` key. Kept so older configs load.
    sandbox: Optional[Literal["bwrap", "none"]] = _f("sandbox", None)
    defaultModel: Optional[str] = _f("defaultModel", None)
    maxTokensDefault: int = _f("maxTokensDefault", 3_000_000, lo=1_000)
    maxTokensMax: int = _f("maxTokensMax", 3_000_000, lo=1_000)
    inProcessThink: bool = _f("inProcessThink", True)     # think agents through the Responses API


@attrs.frozen
class Engines:
    claude: Optional[ClaudeEngine] = _f("claude", None)
    codex: Optional[CodexEngine] = _f("codex", None)

    def configured(self, name: str) -> bool:
        return {"claude": self.claude, "codex": self.codex}.get(name) is not None


@attrs.frozen
class Telemetry:
    """OpenTelemetry traces over OTLP/HTTP; off unless an endpoint is named here or in the
    standard OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT variables."""
    otlpEndpoint: Optional[str] = _f("otlpEndpoint", None, pattern=r"^https?://[^\s]+$")
    includeContent: bool = _f("includeContent", False)


@attrs.frozen
class Dashboard:
    adminLogins: list[str] = _f("adminLogins", factory=list)


@attrs.frozen
class DefaultModels:
    claude: Optional[str] = _f("claude", None)
    codex: Optional[str] = _f("codex", None)


@attrs.frozen
class ModelLists:
    """Per-engine model allowlists (fnmatch globs); None: any model."""
    claude: Optional[list[str]] = _f("claude", None)
    codex: Optional[list[str]] = _f("codex", None)

    def for_engine(self, name: str) -> Optional[list[str]]:
        return {"claude": self.claude, "codex": self.codex}.get(name)


@attrs.frozen
class PriceRow:
    """USD per million tokens."""
    input: float = _f("input", lo=0)
    output: float = _f("output", lo=0)
    cacheRead: Optional[float] = _f("cacheRead", None, lo=0)
    cacheWrite: Optional[float] = _f("cacheWrite", None, lo=0)


@attrs.frozen
class RayPlacement:
    """Agents placed on a Ray cluster (launch/ray.py). The daemon's machine must be a node
    of the cluster (Ray drivers attach to their local raylet)."""
    address: str = _f("address")
    tokenFile: Optional[str] = _f("tokenFile", None)
    resource: str = _f("resource", "swarmbase_agents", pattern=r"^[A-Za-z0-9_./-]{1,100}$")
    labels: dict[str, str] = _f("labels", factory=dict)
    sharedRoots: list[str] = _f("sharedRoots", factory=list)
    startTimeoutMs: int = _f("startTimeoutMs", 300_000, lo=1_000, hi=86_400_000)


@attrs.frozen
class Placement:
    default: Literal["local", "ray"] = _f("default", "local")
    ray: Optional[RayPlacement] = _f("ray", None)


PROJECT_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


@attrs.frozen
class Caller:
    name: str = _f("name", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    tokenSha256: str = _f("tokenSha256", pattern=r"^[0-9a-f]{64}$")
    apiKeyFile: Optional[str] = _f("apiKeyFile", None)
    # None: every engine configured under `engines`.
    engines: Optional[list[Literal["claude", "codex"]]] = _f("engines", None)
    maxProfile: Literal["think", "read", "write"] = _f("maxProfile", "read")
    cwdRoots: list[str] = _f("cwdRoots", factory=list)
    # Named directories under cwdRoots (git repositories or plain dirs) a run works in, as a
    # Claude Code session works in its project; "default" (or the only one) when a run names none.
    projects: dict[str, str] = _f("projects", factory=dict)
    defaultModels: DefaultModels = _f("defaultModels", factory=DefaultModels)
    runUsdDefault: float = _f("runUsdDefault", 5.0, lo=0.03, hi=100_000)
    runUsdMax: float = _f("runUsdMax", 25.0, lo=0.03, hi=100_000)
    maxActiveRuns: int = _f("maxActiveRuns", 3, lo=1, hi=1_000)
    runTokensDefault: int = _f("runTokensDefault", 10_000_000, lo=1_000)
    runTokensMax: int = _f("runTokensMax", 30_000_000, lo=1_000)
    models: ModelLists = _f("models", factory=ModelLists)
    runTimeoutMaxMs: int = _f("runTimeoutMaxMs", 86_400_000, lo=1_000, hi=7 * 86_400_000)
    budgetWarnAt: float = _f("budgetWarnAt", 0.8, lo=0.01, hi=1.0)
    # Hosts its write agents may reach besides the model API: "host" (ports 443 and 80) or
    # "host:port" (launch/egress.py).
    network: list[str] = _f("network", factory=list)
    # Spend quotas over UTC windows (runs/quota.py); None: no quota.
    usdPerDay: Optional[float] = _f("usdPerDay", None, lo=0, hi=10_000_000)
    usdPerMonth: Optional[float] = _f("usdPerMonth", None, lo=0, hi=100_000_000)
    # Where this caller's agents may run; None: everywhere configured (see `placement`).
    placements: Optional[list[Literal["local", "ray"]]] = _f("placements", None)

    def default_project(self) -> tuple[str, str] | None:
        """(name, path) of the project a run that names none works in: "default", else the
        only one; None when the caller has none or several without a default."""
        if "default" in self.projects:
            return "default", self.projects["default"]
        if len(self.projects) == 1:
            return next(iter(self.projects.items()))
        return None


@attrs.frozen
class Config:
    port: int = _f("port", 7360, lo=0, hi=65535)
    publicUrl: Optional[str] = _f("publicUrl", None)
    engines: Engines = _f("engines", factory=Engines)
    maxConcurrentAgents: int = _f("maxConcurrentAgents", 16, lo=1, hi=1_000)
    perRunConcurrency: int = _f("perRunConcurrency", 16, lo=1, hi=1_000)
    maxAgentsPerRun: int = _f("maxAgentsPerRun", 1000, lo=1, hi=100_000)
    dashboard: Dashboard = _f("dashboard", factory=Dashboard)
    telemetry: Telemetry = _f("telemetry", factory=Telemetry)
    callers: list[Caller] = _f("callers", factory=list)
    prices: dict[str, PriceRow] = _f("prices", factory=dict)
    deleteWorkOnEnd: bool = _f("deleteWorkOnEnd", True)
    resumeInterruptedOnBoot: bool = _f("resumeInterruptedOnBoot", False)
    scriptSliceMs: int = _f("scriptSliceMs", 5000, lo=50, hi=600_000)
    agentTimeoutMs: int = _f("agentTimeoutMs", 1_800_000, lo=1_000, hi=86_400_000)
    agentIdleTimeoutMs: int = _f("agentIdleTimeoutMs", 300_000, lo=1_000, hi=86_400_000)
    # Every child (runners, agents) runs inside bubblewrap unless "none".
    sandbox: Optional[Literal["bwrap", "none"]] = _f("sandbox", None)
    homesDir: Optional[str] = _f("homesDir", None)
    # When the daemon is root: the uids it gives callers, one each (identity.py); or, the
    # older setting, one user (a name, or uid[:gid]) every caller's children share.
    sandboxUids: Optional[str] = _f("sandboxUids", None)
    sandboxUser: Optional[str] = _f("sandboxUser", None)
    runnerMemoryMb: int = _f("runnerMemoryMb", 512, lo=64, hi=65_536)
    runnerCpuSeconds: int = _f("runnerCpuSeconds", 600, lo=1, hi=86_400)
    # Script runners started ahead of need, each used by one script only (0: none).
    spareRunners: int = _f("spareRunners", 1, lo=0, hi=16)
    runTimeoutMs: int = _f("runTimeoutMs", 21_600_000, lo=1_000, hi=7 * 86_400_000)
    maxPhasesPerRun: int = _f("maxPhasesPerRun", 1_000, lo=1, hi=1_000_000)
    maxLogBytesPerRun: int = _f("maxLogBytesPerRun", 10 * 1024 * 1024, lo=1_024, hi=1024 ** 3)
    maxWorkflowDepth: int = _f("maxWorkflowDepth", 3, lo=0, hi=20)
    maxWorkflowsPerRun: int = _f("maxWorkflowsPerRun", 50, lo=0, hi=10_000)
    placement: Placement = _f("placement", factory=Placement)
    # When ended runs are archived or deleted (runs/retention_rules.py); None: kept for ever.
    retention: Optional[Retention] = _f("retention", None)
    # Where the config was read from; the state dir is its folder. Not a JSON key.
    path: Path = attrs.field(default=Path("config.json"), metadata={"key": None})

    @property
    def state_dir(self) -> Path:
        return self.path.parent

    @property
    def homes_dir(self) -> Path:
        """Agents' and runners' private dirs (HOME, TMPDIR, CODEX_HOME), deleted after each."""
        return Path(self.homesDir) if self.homesDir else self.state_dir / "homes"

    @property
    def sandbox_mode(self) -> str:
        return self.sandbox or "bwrap"

    def caller(self, name: str) -> Caller | None:
        return next((c for c in self.callers if c.name == name), None)

    def default_placement(self, caller: Caller) -> str:
        """placement.default when the caller may use it, else the caller's first placement."""
        allowed = caller.placements or ["local"]
        return self.placement.default if self.placement.default in allowed else allowed[0]


CONVERTER = converter(Retention, ClaudeEngine, CodexEngine, Engines, Dashboard, Telemetry, DefaultModels, ModelLists, PriceRow,
                      RayPlacement, Placement, Caller, Config)


def _apply_aliases(raw: dict[str, Any]) -> dict[str, Any]:
    """apiBaseUrl / claudeBin → engines.claude.baseUrl / .bin; caller defaultModel → defaultModels.claude."""
    raw = dict(raw)
    legacy = {k: raw.pop(k) for k in ("apiBaseUrl", "claudeBin") if k in raw}
    if legacy:
        engines = dict(raw.get("engines") or {})
        claude = dict(engines.get("claude") or {})
        if "apiBaseUrl" in legacy:
            claude.setdefault("baseUrl", legacy["apiBaseUrl"])
        if "claudeBin" in legacy:
            claude.setdefault("bin", legacy["claudeBin"])
        engines["claude"] = claude
        raw["engines"] = engines
    if isinstance(raw.get("callers"), list):
        callers = []
        for c in raw["callers"]:
            if isinstance(c, dict) and "defaultModel" in c:
                c = dict(c)
                models = dict(c.get("defaultModels") or {})
                models.setdefault("claude", c.pop("defaultModel"))
                c["defaultModels"] = models
            callers.append(c)
        raw["callers"] = callers
    return raw


def expand(p: str) -> str:
    return os.path.expanduser(p)


def resolve_bin(value: str, path: str, search_path: str | None = None) -> str:
    """A bare name is looked up on PATH now, so a missing CLI stops start-up, not an agent."""
    candidate = expand(value)
    if os.sep not in candidate:
        found = shutil.which(candidate, path=search_path)
        if not found:
            raise ConfigError(f"{path}: {value!r} was not found on PATH")
        return found
    if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
        raise ConfigError(f"{path}: {candidate} does not exist or is not executable")
    return candidate


def key_file_problem(path: str | None) -> str | None:
    """Why a caller's key file cannot be used now, naming it (None: it can). Checked when
    the caller starts a run and when an agent reads it, not when the config loads: one
    caller's missing or world-readable key file refuses that caller's runs and stops
    nobody else (issue 25 #7), and fixing it needs no restart."""
    if not path:
        return None
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"the key file {path} does not exist"
    except OSError as e:
        return f"the key file {path} cannot be read ({e.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return f"the key file {path} is not a regular file"
    if stat.S_IMODE(st.st_mode) & 0o077:
        return (f"the key file {path} must be mode 0600 (it is {stat.S_IMODE(st.st_mode):04o}); "
                f"run: chmod 600 {path}")
    return None


def key_file_problems(cfg: "Config") -> list[tuple[str, str]]:
    """(caller name, problem) for every caller whose key file cannot be used now."""
    return [(c.name, p) for c in cfg.callers if (p := key_file_problem(c.apiKeyFile)) is not None]


def fill_command(path: str) -> str:
    """The one command that puts the key in a caller's (existing, 0600) key file: printf
    adds no newline, and the variable keeps the key out of the shell's history."""
    return f"printf '%s' \"$ANTHROPIC_API_KEY\" > {shlex.quote(path)}"


def key_file_unfilled(path: str | None) -> str | None:
    """Why a usable key file still holds no key (the first start and add-caller make it
    empty), with the command that fills it; None when it holds one or cannot be read (that
    is key_file_problem's). Not a reason to refuse a run: a script without agents needs no
    key. `check-config` and the start-up log say it; an agent() call fails with it."""
    if not path or key_file_problem(path) is not None:
        return None
    try:
        with open(path, "rb") as f:
            if f.read(4096).strip():
                return None
    except OSError:
        return None
    return empty_key_file(path)


def empty_key_file(path: str) -> str:
    return f"the key file {path} is empty; put the caller's API key (or gateway token) in it: {fill_command(path)}"


def key_files_unfilled(cfg: "Config") -> list[tuple[str, str]]:
    """(caller name, what to do) for every usable key file that is still empty."""
    return [(c.name, p) for c in cfg.callers if (p := key_file_unfilled(c.apiKeyFile)) is not None]


def under_temp_dir(path: str) -> bool:
    import tempfile
    real = os.path.realpath(path)
    return any(real == t or real.startswith(t.rstrip("/") + "/")
               for t in {os.path.realpath(tempfile.gettempdir()), "/tmp"})


SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")


def _sandbox_checks(cfg: Config, search_path: str | None) -> Config:
    """One daemon-wide sandbox setting; engines.codex.sandbox is read as its old alias."""
    legacy = cfg.engines.codex.sandbox if cfg.engines.codex else None
    if legacy and cfg.sandbox and legacy != cfg.sandbox:
        raise ConfigError(f'engines.codex.sandbox: "{legacy}" contradicts sandbox: "{cfg.sandbox}" '
                          '(sandbox is daemon-wide now; drop engines.codex.sandbox)')
    mode = cfg.sandbox or legacy or "bwrap"
    if mode == "bwrap" and not shutil.which("bwrap", path=search_path):
        raise ConfigError('sandbox: "bwrap" (the default) but bubblewrap is not installed; install it '
                          '(Debian/Ubuntu: apt-get install bubblewrap) or set "sandbox": "none"')
    if cfg.sandboxUser is not None and cfg.sandboxUids is not None:
        raise ConfigError("sandboxUser and sandboxUids both set: sandboxUids gives each caller a uid of its own, "
                          "sandboxUser one shared user; keep one (sandboxUids is the safer)")
    try:
        identity.resolve(cfg.sandboxUser)
        identity.UidRange.parse(cfg.sandboxUids or identity.DEFAULT_UIDS)
    except identity.IdentityError as e:
        raise ConfigError(str(e)) from None
    if mode == "bwrap" and os.geteuid() == 0 and not shutil.which("setpriv", path=search_path):
        raise ConfigError("the daemon runs as root, and dropping to each caller's uid needs setpriv "
                          "(util-linux), which is not installed")
    homes = expand(cfg.homesDir) if cfg.homesDir else os.path.abspath(cfg.state_dir / "homes")
    if not os.path.isabs(homes):
        raise ConfigError(f"homesDir: {homes!r} must be an absolute path")
    for name, where in (("the state dir", os.path.realpath(cfg.state_dir)), ("homesDir", os.path.realpath(homes))):
        if mode == "bwrap" and any(where == d or where.startswith(d + "/") for d in SYSTEM_DIRS):
            raise ConfigError(f"{name} {where} is under a system dir every sandbox mounts ({', '.join(SYSTEM_DIRS)}); "
                              "move it")
    if mode == "none" and cfg.engines.codex is not None and cfg.engines.codex.baseUrl and under_temp_dir(homes):
        raise ConfigError(f"homesDir: {homes} is under the temp dir; without the sandbox codex then cannot make "
                          "its PATH aliases and every sandboxed command fails. Set homesDir to a folder "
                          "outside the temp dir (or use sandbox: \"bwrap\", which mounts homes elsewhere)")
    return attrs.evolve(cfg, sandbox=mode, homesDir=homes)


def _check_token_file(path: str, where: str) -> None:
    """The Ray token is code execution on every node: a file only its owner reads."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(f"{where}: cannot read the Ray token file {path}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{where}: {path} is not a file")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise ConfigError(f"{where}: the Ray token file {path} must be mode 0600 (it is "
                          f"{stat.S_IMODE(st.st_mode):04o}); anyone holding it runs code on every node. "
                          f"Run: chmod 600 {path}")
    if st.st_size == 0:
        raise ConfigError(f"{where}: the Ray token file {path} is empty")


def _placement_checks(cfg: Config) -> Config:
    pl = cfg.placement
    if pl.ray is None:
        if pl.default == "ray":
            raise ConfigError('placement.default: "ray" needs placement.ray (address, tokenFile)')
        return cfg
    rp = pl.ray
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,253}:[0-9]{1,5}|\[[0-9A-Fa-f:]{2,39}\]:[0-9]{1,5}", rp.address):
        raise ConfigError(f"placement.ray.address: {rp.address[:100]!r} must be the head's GCS address as "
                          "host:port (e.g. 10.0.0.5:6379); Ray Client (ray://) is not supported")
    if rp.tokenFile is None:
        raise ConfigError("placement.ray.tokenFile: required: SwarmBase refuses a Ray cluster without token "
                          "authentication (start every node with RAY_AUTH_MODE=token; see ops/ray.md)")
    token = expand(rp.tokenFile)
    _check_token_file(token, "placement.ray.tokenFile")
    for k, v in rp.labels.items():
        if not re.fullmatch(r"[A-Za-z0-9_./-]{1,253}", k) or not re.fullmatch(r"[A-Za-z0-9_./-]{0,63}", v):
            raise ConfigError(f"placement.ray.labels.{k}: label keys and values are letters, digits and _ . / -")
    roots = []
    for j, r in enumerate(rp.sharedRoots):
        r = expand(r)
        if not os.path.isabs(r):
            raise ConfigError(f"placement.ray.sharedRoots[{j}]: {r!r} must be an absolute path")
        real = os.path.realpath(r)
        for p in (os.path.realpath(cfg.state_dir), os.path.realpath(cfg.homes_dir)):
            if p == real or p.startswith(real.rstrip("/") + "/"):
                raise ConfigError(f"placement.ray.sharedRoots[{j}]: {r} contains the daemon's state dir or homesDir")
        roots.append(real)
    import importlib.util
    if importlib.util.find_spec("ray") is None:     # never imported here: the daemon imports Ray only to use it
        raise ConfigError("placement.ray: Ray is not installed; run: pip install 'swarmbase[ray]'")
    return attrs.evolve(cfg, placement=attrs.evolve(pl, ray=attrs.evolve(rp, tokenFile=token, sharedRoots=roots)))


def _semantic_checks(cfg: Config, search_path: str | None) -> Config:
    cfg = _sandbox_checks(cfg, search_path)
    cfg = _placement_checks(cfg)
    check_retention(cfg.retention)
    engines = cfg.engines
    if engines.claude is not None:
        if engines.claude.baseUrl and (why := egress.url_error(engines.claude.baseUrl)):
            raise ConfigError(f"engines.claude.baseUrl: {why}")
        engines = attrs.evolve(engines, claude=attrs.evolve(
            engines.claude, bin=resolve_bin(engines.claude.bin, "engines.claude.bin", search_path)))
    if engines.codex is not None and not engines.codex.baseUrl:
        # The spec: omit baseUrl to leave the engine off.
        engines = attrs.evolve(engines, codex=None)
    if engines.codex is not None:
        cx = engines.codex
        if cx.maxTokensDefault > cx.maxTokensMax:
            raise ConfigError(f"engines.codex.maxTokensDefault: {cx.maxTokensDefault} is above maxTokensMax {cx.maxTokensMax}")
        engines = attrs.evolve(engines, codex=attrs.evolve(
            cx, bin=resolve_bin(cx.bin, "engines.codex.bin", search_path)))
    names: dict[str, int] = {}
    hashes: dict[str, int] = {}
    callers = []
    for i, c in enumerate(cfg.callers):
        where = f"callers[{i}]"
        if c.name in names:
            raise ConfigError(f"{where}.name: duplicate caller name {c.name!r} (also callers[{names[c.name]}])")
        names[c.name] = i
        if c.tokenSha256 in hashes:
            raise ConfigError(f"{where}.tokenSha256: the same token hash as callers[{hashes[c.tokenSha256]}]; "
                              f"every caller needs its own token")
        hashes[c.tokenSha256] = i
        if c.runUsdDefault > c.runUsdMax:
            raise ConfigError(f"{where}.runUsdDefault: {c.runUsdDefault:g} is above runUsdMax {c.runUsdMax:g}")
        if c.usdPerDay is not None and c.usdPerMonth is not None and c.usdPerDay > c.usdPerMonth:
            raise ConfigError(f"{where}.usdPerDay: {c.usdPerDay:g} is above usdPerMonth {c.usdPerMonth:g}")
        if c.runTokensDefault > c.runTokensMax:
            raise ConfigError(f"{where}.runTokensDefault: {c.runTokensDefault} is above runTokensMax {c.runTokensMax}")
        key_file = expand(c.apiKeyFile) if c.apiKeyFile else None     # checked per run: key_file_problem
        roots = []
        protected = [os.path.realpath(cfg.state_dir), os.path.realpath(cfg.homes_dir)]
        for j, r in enumerate(c.cwdRoots):
            r = expand(r)
            if not os.path.isabs(r):
                raise ConfigError(f"{where}.cwdRoots[{j}]: {r!r} must be an absolute path")
            real = os.path.realpath(r)
            if any(p == real or p.startswith(real.rstrip("/") + "/") for p in protected):
                raise ConfigError(f"{where}.cwdRoots[{j}]: {r} contains the daemon's state dir or homesDir; "
                                  "agents there could read every caller's keys")
            roots.append(real)
        projects = {}
        for name, p in c.projects.items():
            if not PROJECT_NAME.fullmatch(name):
                raise ConfigError(f"{where}.projects: {name[:80]!r} is not a project name (letters, digits, . _ -; "
                                  "at most 64)")
            p = expand(p)
            real = os.path.realpath(p)
            if not os.path.isabs(p):
                raise ConfigError(f"{where}.projects.{name}: {p!r} must be an absolute path")
            if not any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots):
                raise ConfigError(f"{where}.projects.{name}: {p} is not inside the caller's cwdRoots")
            if not os.path.isdir(real):
                raise ConfigError(f"{where}.projects.{name}: {p} is not a directory")
            projects[name] = real
        allowed = c.engines
        if allowed is None:
            allowed = [e for e in ENGINES if engines.configured(e)]
        for j, e in enumerate(allowed):
            if not engines.configured(e):
                raise ConfigError(f"{where}.engines[{j}]: engine {e!r} is not configured under engines")
        if "codex" in allowed:
            assert engines.codex is not None
            model = c.defaultModels.codex or engines.codex.defaultModel
            if not model:
                raise ConfigError(f"{where}.defaultModels.codex: caller {c.name!r} may use codex but no model is "
                                  "configured; set engines.codex.defaultModel or the caller's defaultModels.codex "
                                  "(the daemon must know every codex agent's model to price it)")
            patterns = c.models.codex
            if patterns is not None and not any(fnmatch.fnmatchcase(model, p) for p in patterns):
                raise ConfigError(f"{where}.models.codex: the caller's codex default model {model!r} is not in "
                                  "its allowlist")
        for j, entry in enumerate(c.network):
            if why := egress.entry_error(entry):
                raise ConfigError(f"{where}.network[{j}]: {why}")
        placements = c.placements
        if placements is None:
            placements = [p for p in PLACEMENTS if p == "local" or cfg.placement.ray is not None]
        for j, p in enumerate(placements):
            if p == "ray" and cfg.placement.ray is None:
                raise ConfigError(f'{where}.placements[{j}]: "ray" is not configured (placement.ray)')
        if not placements:
            raise ConfigError(f"{where}.placements: must name at least one placement")
        callers.append(attrs.evolve(c, apiKeyFile=key_file, cwdRoots=roots, projects=projects, engines=list(allowed),
                                    placements=list(dict.fromkeys(placements))))
    return attrs.evolve(cfg, callers=callers, engines=engines)


def revalidate(cfg: Config, search_path: str | None = None) -> Config:
    """The checks `parse` makes, again, on a Config built from parsed ones (reload.py
    merges a new file with the running restart-only settings)."""
    return _semantic_checks(cfg, search_path)


def parse(text: str, path: Path, search_path: str | None = None) -> Config:
    try:
        raw = jsonc.loads(text)
    except ValueError as e:
        raise ConfigError(f"not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"the config must be a JSON object, got {type_name(raw)}")
    raw = _apply_aliases(raw)
    check_object(Config, raw, "")
    cfg = CONVERTER.structure(raw, Config)
    cfg = attrs.evolve(cfg, path=path)
    return _semantic_checks(cfg, search_path)


def config_path(env: typing.Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    named = env.get("SWARMBASE_CONFIG")
    if named:
        return Path(expand(named)).absolute()
    return Path(expand("~/.swarmbase/config.json"))


def load(path: Path, search_path: str | None = None) -> Config:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None
    try:
        return parse(text, path, search_path)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
