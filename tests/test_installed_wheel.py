"""The daemon as a non-editable install: a wheel built from this checkout, installed into a
fresh venv, started as `swarmbase` from a directory outside the checkout with nothing
pointing back at it, runs a script end to end, serves the guide and the dashboard; and an
installation missing a runner module refuses to start with one line naming it.

The wheel goes in with `--no-deps` and the venv borrows this interpreter's site-packages
for the dependencies through a path-only .pth line (such a line adds the directory to
sys.path, but .pth files inside it, this checkout's editable finder among them, are not
run): what is tested is what the wheel carries, without downloading ~40 packages per run.
bench/wheel_first_run.py installs the wheel with its dependencies, the way a user does,
and prints the time from `pip install` to a completed first run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
import trio

from . import installed
from .clidaemon import cli_daemon
from .conftest import write_config
from .sockets import free_port


@pytest.mark.timeout(900)
async def test_an_installed_wheel_runs_a_script_outside_the_checkout(tmp_path: Path) -> None:
    wheel = await trio.to_thread.run_sync(installed.build_wheel, tmp_path / "build")
    python = await trio.to_thread.run_sync(installed.make_venv, tmp_path / "venv", False)
    await trio.to_thread.run_sync(installed.pip_install, python, "--no-deps", "--no-index", str(wheel))
    env = installed.outside_env(dict(os.environ))
    deps = Path(trio.__file__).resolve().parent.parent          # where this interpreter's packages are
    assert not (deps / "swarmbase").exists() and not (deps / "dashboard").exists()
    site = installed.site_packages(python)
    (site / "zz_test_dependencies.pth").write_text(str(deps) + "\n")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = await trio.run_process(
        [str(python), "-c", "import swarmbase, dashboard, swarmbase.script.runner as r; "
                            "print(swarmbase.__file__); print(dashboard.__file__); print(r.RUNNER)"],
        cwd=elsewhere, env=env, capture_stdout=True)
    files = where.stdout.decode().split()
    assert all(f.startswith(str(site)) for f in files), files     # nothing from the checkout
    assert files[2].endswith("swarmbase/_sandbox/runner.mjs")

    port = free_port()
    cfg_path, _ = write_config(tmp_path / "state", callers=["local"], port=port)
    env["SWARMBASE_CONFIG"] = str(cfg_path)
    daemon = [str(python.parent / "swarmbase")]                 # the console script
    async with cli_daemon(cfg_path, env, daemon, elsewhere) as d:
        with trio.fail_after(120):
            client = [str(python), "-m", "swarmbase.client", "local"]
            run = await trio.run_process(
                [*client, "run", json.dumps({"script": "// installed\nphase('hi'); return 6 * 7"}), "--wait"],
                cwd=elsewhere, env=env, capture_stdout=True, capture_stderr=True, check=False)
            out = run.stdout.decode()
            assert run.returncode == 0, (out, run.stderr.decode(), d.stderr.decode())
            assert "swarmbase:completed" in out and 'Run "installed"' in out and "\n```json\n42\n```" in out
            guide = await trio.run_process([*client, "guide"], cwd=elsewhere, env=env, capture_stdout=True)
            assert "agent(" in guide.stdout.decode()
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
                for page in ("/", "/spend", "/nodes", "/static/app.css", "/spend/static/spend.js"):
                    assert (await c.get(page)).status_code == 200, page
    assert b"Traceback" not in d.stderr

    # An installation without one of the runner's modules says so and does not start.
    missing = site / "swarmbase" / "_sandbox" / "context" / "guards.mjs"
    missing.unlink()
    broken = await trio.run_process(daemon, cwd=elsewhere, env=env, capture_stderr=True, check=False)
    lines = broken.stderr.decode().strip().splitlines()
    assert broken.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith("swarmbase: cannot start: files the daemon needs are missing")
    assert str(missing) in lines[0]
