"""Start-up check that every file the daemon reads from its own installation is there:
the Node script runner and every module it imports, the guide, the dashboard's templates
and the assets they load.

Why: a `pip install .` or a wheel once shipped the dashboard and the guide but not
sandbox/runner.mjs; the daemon started without a word and every run failed with
"internal error: ExceptionGroup". Reading the runner's imports and the templates' asset
links (instead of a list kept by hand) means a module or asset added later is checked
without anyone remembering to add it here. Costs a few file reads at start-up.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from .script import runner

PACKAGE = Path(__file__).resolve().parent


def dashboard_dir() -> Path:
    """Where the daemon will import the dashboard from (found, not imported)."""
    spec = importlib.util.find_spec("dashboard")
    if spec is None or not spec.submodule_search_locations:
        return PACKAGE.parent / "dashboard"
    return Path(list(spec.submodule_search_locations)[0])


TEMPLATES = ("base.html", "list.html", "run.html", "agent.html", "error.html", "spend.html", "nodes.html",
             "admin_login.html")
_IMPORT = re.compile(r"""^\s*(?:import|export)\b[^'"]*?['"](\.{1,2}/[^'"]+)['"]""", re.M)
_ASSET = re.compile(r"""(?:src|href)="/(?:[a-z]+/)?static/([^"?#]+)["?#]""")


def runner_files(entry: Path) -> list[Path]:
    """runner.mjs and every relative module it imports, however deep."""
    seen: list[Path] = []
    todo = [entry]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.append(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue            # reported as missing by the caller
        todo += [(path.parent / rel).resolve() for rel in _IMPORT.findall(text)]
    return seen


def dashboard_files(dashboard: Path) -> list[Path]:
    templates = [dashboard / "templates" / name for name in TEMPLATES]
    assets: list[Path] = []
    for t in templates:
        try:
            text = t.read_text(encoding="utf-8")
        except OSError:
            continue
        assets += [dashboard / "static" / name for name in _ASSET.findall(text)]
    return templates + sorted(set(assets))


def needed_files() -> list[Path]:
    return [*runner_files(runner.RUNNER), PACKAGE / "guide.md", *dashboard_files(dashboard_dir())]


def missing_files() -> list[Path]:
    return [p for p in needed_files() if not p.is_file()]


def problem() -> str | None:
    """One line for the operator, or None when the installation is whole."""
    missing = missing_files()
    if not missing:
        return None
    shown = ", ".join(str(p) for p in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    return (f"files the daemon needs are missing from its installation: {shown}; reinstall swarmbase "
            f"(pip install, a wheel or pipx must include them)")
