"""A wheel of this checkout installed into a fresh venv (tests/test_installed_wheel.py and
bench/wheel_first_run.py): what `pip install .`, a wheel or pipx give a user."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
# Never copied into the build: git's files, test tools, build leftovers (a stale build/lib
# would put files into the wheel that the checkout no longer has).
IGNORED = shutil.ignore_patterns(".git", ".tools", "node_modules", "build", "dist", "*.egg-info", "__pycache__",
                                 ".venv", "artifacts", ".pytest_cache")


def build_wheel(work: Path) -> Path:
    """`pip wheel` of a clean copy of the checkout (an isolated build, as `pip install .`
    makes: setuptools comes from the package index)."""
    src = work / "src"
    shutil.copytree(CHECKOUT, src, ignore=IGNORED, symlinks=True)
    dist = work / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--disable-pip-version-check",
                    "-w", str(dist), str(src)], check=True, cwd=work, timeout=600, env=outside_env(dict(os.environ)))
    [wheel] = dist.glob("swarmbase-*.whl")
    return wheel


def make_venv(path: Path, with_pip: bool = True) -> Path:
    """A fresh venv; returns its python. Without pip (ensurepip is ~20 s of a loaded
    2-core machine) it is filled by this interpreter's pip (`pip --python`)."""
    subprocess.run([sys.executable, "-m", "venv", *([] if with_pip else ["--without-pip"]), str(path)],
                   check=True, timeout=300)
    return path / "bin" / "python"


def pip_install(python: Path, *args: str) -> None:
    """`pip install` into the venv of `python`, by its own pip or, if it has none, by ours."""
    has_pip = (python.parent / "pip").exists()
    pip = [str(python), "-m", "pip"] if has_pip else [sys.executable, "-m", "pip", "--python", str(python)]
    subprocess.run([*pip, "install", "--quiet", "--disable-pip-version-check", *args], check=True, timeout=900,
                   env=outside_env(dict(os.environ)))


def site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True, timeout=60)
    return Path(out.stdout.strip())


def outside_env(base: dict[str, str]) -> dict[str, str]:
    """The environment of a user's shell: nothing pointing into this checkout."""
    return {k: v for k, v in base.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
