"""Time from `pip install` of the wheel to a completed first run, as a new user meets it.

    python3 bench/wheel_first_run.py [--cold] [--keep]

Builds a wheel of this checkout (not timed into the figure), makes a fresh venv with pip
(`python3 -m venv`, timed apart), then times: `pip install <wheel>` with its dependencies
from the package index (pip's cache as it is, or none with --cold); the first start of the
installed `swarmbase` on a fresh state dir (it writes the first config) until it listens;
and `python -m swarmbase.client local run '{"script": ...}' --wait` until the run's end
notice. Everything runs from a directory outside the checkout with no PYTHONPATH. Prints
figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests import installed  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cold", action="store_true", help="pip install without its cache (downloads everything)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch dir and print where it is")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sb-wheel-"))
    try:
        t = time.monotonic()
        wheel = installed.build_wheel(work / "build")
        build_s = time.monotonic() - t
        t = time.monotonic()
        python = installed.make_venv(work / "venv")
        venv_s = time.monotonic() - t

        env = installed.outside_env(dict(os.environ))
        env["SWARMBASE_CONFIG"] = str(work / "home" / "config.json")
        elsewhere = work / "elsewhere"
        elsewhere.mkdir()
        port = free_port()

        t0 = time.monotonic()
        installed.pip_install(python, *(["--no-cache-dir"] if a.cold else []), str(wheel))
        t_installed = time.monotonic()
        proc = subprocess.Popen([str(python.parent / "swarmbase"), "--port", str(port)], cwd=elsewhere, env=env,
                                stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                if "listening on" in line:
                    break
            else:
                raise SystemExit(f"the daemon did not start (exit {proc.wait()})")
            t_listening = time.monotonic()
            run = subprocess.run([str(python), "-m", "swarmbase.client", "local", "run",
                                  json.dumps({"script": "phase('hi'); return 6 * 7"}), "--wait"],
                                 cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
            t_done = time.monotonic()
            if run.returncode != 0 or "swarmbase:completed" not in run.stdout:
                raise SystemExit(f"the first run did not complete:\n{run.stdout}\n{run.stderr}")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        packages = len([p for p in installed.site_packages(python).glob("*.dist-info")])
        print(f"wheel build (not in the figure):          {build_s:6.1f} s  ({wheel.stat().st_size / 1024:.0f} KiB)")
        print(f"python3 -m venv (not in the figure):      {venv_s:6.1f} s")
        print(f"pip install of the wheel{' (--no-cache-dir)' if a.cold else ''}:"
              f"{'' if a.cold else '                '} {t_installed - t0:6.1f} s  ({packages} distributions)")
        print(f"first start until listening:             {t_listening - t_installed:6.1f} s")
        print(f"first run (client run --wait):           {t_done - t_listening:6.1f} s")
        print(f"pip install -> completed first run:      {t_done - t0:6.1f} s")
    finally:
        if a.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
