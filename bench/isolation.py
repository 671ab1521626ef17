"""What the sandbox costs at start-up (issues 13 and 20).

    python3 bench/isolation.py [--n 50] [--agents 50] [--before TREE]

- process start: the local launcher running a trivial program (exit at once), with the
  sandbox and without, median of n;
- agent start: a real claude agent against the fake API (`run` → its result), in a daemon
  with the sandbox and one without;
- runner start: a trivial run (`run` → end notice) with and without;
- worktree git (issue 20): one sandboxed git call (`git rev-parse HEAD` on a repository
  the sandbox user owns) against the same git run directly.
- with `--before TREE` (a checkout of the code before issue 20): the same claude agent run
  on a daemon from that tree and on one from this tree, alternated run by run so that a
  loaded machine's drift hits both alike; and the bare sandbox command line before
  (one bwrap as root) against now, alternated the same way.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time

import trio

from common import CLAUDE, ROOT, alternated_runs, first_line_ms, start, state_dir, stop, summary, write_config  # noqa: E402
from swarmbase.client import connect
from swarmbase.launch.local import LocalLauncher
from swarmbase.launch.spec import LaunchSpec

from fakes.anthropic_api import FakeAnthropic  # noqa: E402


async def process_starts(mode: str, n: int) -> list[float]:
    tmp = state_dir("sb-iso-")
    tmp.chmod(0o755)             # the cwd: readable by the sandbox user when the bench runs as root
    (tmp / "procs").mkdir()
    launcher = LocalLauncher(mode=mode, homes=tmp / "homes", procs=tmp / "procs")
    spec = LaunchSpec(argv=("/bin/echo", "ready"), env={"PATH": "/usr/bin:/bin"}, cwd=str(tmp), key="k",
                      files={"x": b"1"}, read=(str(tmp),))
    out = []
    for _ in range(n):
        out.append(await first_line_ms(launcher, spec))
    return out


async def through_daemon(mode: str, api_url: str, n: int, nursery: trio.Nursery) -> tuple[list[float], list[float]]:
    state = state_dir(f"sb-iso-{mode}-")
    token = write_config(state, {"sandbox": mode, "engines": {"claude": {"bin": str(CLAUDE), "baseUrl": api_url}}})
    d = await start(state, token, nursery)
    agents, runs = [], []
    try:
        async with connect(d.ws, token) as h:
            await h.handshake()
            for script, into in (("return 1", runs), ("return await agent('hi')", agents)):
                for _ in range(n):
                    t = time.perf_counter()
                    rid = (await h.tool("run", {"script": script}))["structuredContent"]["runId"]
                    await h.wait_notice(f"{rid}:end")
                    into.append((time.perf_counter() - t) * 1000)
    finally:
        await stop(d)
    return agents, runs


async def git_calls(n: int) -> tuple[list[float], list[float]] | None:
    try:
        from swarmbase.identity import adopt_tree
        from swarmbase.runs.git_sandbox import SandboxedGit
    except ImportError:
        return None                              # the tree before issue 20: git ran unsandboxed
    tmp = state_dir("sb-iso-git-")
    (tmp / "procs").mkdir()
    repo = tmp / "repo"
    for args in (["init", "-q", str(repo)], ["-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@b",
                                              "commit", "-q", "--allow-empty", "-m", "x"]):
        subprocess.run(["git", *args], check=True)
    launcher = LocalLauncher(mode="bwrap", homes=tmp / "homes", procs=tmp / "procs")
    adopt_tree(launcher.user_for(None), repo)       # git of no caller: the range's own uid
    git = SandboxedGit(launcher)
    common = str(repo / ".git")
    sandboxed, direct = [], []
    for _ in range(n):
        t = time.perf_counter()
        await git.run("git rev-parse HEAD", common=common, cwd=common, roots=(str(tmp),), caller_paths=(common,))
        sandboxed.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        await trio.run_process(["git", "-c", "safe.directory=*", "-C", str(repo), "rev-parse", "HEAD"],
                               capture_stdout=True)
        direct.append((time.perf_counter() - t) * 1000)
    return sandboxed, direct


BEFORE_ARGV = ["bwrap", "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--new-session",
               "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/run"]


async def command_lines(n: int) -> dict[str, list[float]]:
    """The bare sandbox, `true` inside: the pre-issue-20 command line (one bwrap, as the
    daemon's user, paths bound by name) against today's (pinned fds, seccomp, and as root
    the two stages), alternated."""
    from swarmbase import seccomp
    from swarmbase.identity import resolve
    from swarmbase.launch.pins import pin
    from swarmbase.launch.sandbox import ETC_FILES, Confinement, HostLayout, bwrap_argv
    layout = HostLayout.probe()
    cwd = state_dir("sb-iso-cl-")
    cwd.chmod(0o755)
    before = BEFORE_ARGV + [x for link, target in layout.symlinks for x in ("--symlink", target, link)]
    before += [x for d in layout.dirs for x in ("--ro-bind", d, d)]
    before += [x for f in ETC_FILES for x in ("--ro-bind-try", f, f)]
    before += ["--ro-bind", str(cwd), str(cwd), "--chdir", str(cwd), "--", "/usr/bin/true"]
    out: dict[str, list[float]] = {"before": [], "now": []}
    for _ in range(n):
        t = time.perf_counter()
        await trio.run_process(before)
        out["before"].append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        pinned = pin(key="k", cwd=str(cwd), read=[str(cwd)], write=[], private=None, forbidden=[])
        sfd = seccomp.program_fd("strict")
        c = Confinement(cwd=str(cwd), read=(str(cwd),), fds=pinned.fds, seccomp_fd=sfd, user=resolve("nobody"))
        try:
            await trio.run_process(bwrap_argv(layout, c) + ["/usr/bin/true"], pass_fds=c.passed_fds())
        finally:
            pinned.close()
            os.close(sfd)
        out["now"].append((time.perf_counter() - t) * 1000)
    return out


async def before_after(tree: str, api_url: str, n: int, nursery: trio.Nursery) -> dict[str, list[float]]:
    daemons = {}
    for label, code in (("before", tree), ("now", str(ROOT))):
        state = state_dir(f"sb-iso-{label}-")
        token = write_config(state, {"sandbox": "bwrap", "engines": {"claude": {"bin": str(CLAUDE), "baseUrl": api_url}}})
        os.environ["PYTHONPATH"] = code          # the daemon process runs that tree's code
        daemons[label] = await start(state, token, nursery)
    try:
        return await alternated_runs(daemons, "return await agent('hi')", n)
    finally:
        for d in daemons.values():
            await stop(d)


async def main(n: int, n_agents: int, before: str | None = None) -> None:
    try:
        from swarmbase.identity import resolve
        user = resolve("nobody")
        print(f"children run as: {user.describe() if user else 'the daemon user'} "
              f"(daemon uid {os.geteuid()}); confinement: user namespace, no capabilities, seccomp")
    except ImportError:
        print(f"children run as: the daemon's uid {os.geteuid()} (the tree before issue 20: no user namespace)")
    async with trio.open_nursery() as nursery:
        api = await nursery.start(FakeAnthropic().serve)
        for mode in ("bwrap", "none"):
            print(f"[{mode}] process start to first line: {summary(await process_starts(mode, n))}")
        gits = await git_calls(n)
        if gits is not None:
            print(f"[bwrap] sandboxed git call: {summary(gits[0])}; direct git: {summary(gits[1])}")
        if before is not None:
            lines = await command_lines(n)
            print(f"bare sandbox, before issue 20: {summary(lines['before'])}; now: {summary(lines['now'])}")
            ab = await before_after(before, api.url, n_agents, nursery)
            print(f"claude agent run, daemon before issue 20: {summary(ab['before'])}; now: {summary(ab['now'])}")
            print(f"confinement cost: {statistics.median(ab['now']) - statistics.median(ab['before']):+.1f} ms per "
                  f"agent, {statistics.median(lines['now']) - statistics.median(lines['before']):+.1f} ms per "
                  "bare start (medians, alternated)")
            nursery.cancel_scope.cancel()
            return
        res = {mode: await through_daemon(mode, api.url, n_agents, nursery) for mode in ("bwrap", "none")}
        for mode, (agents, runs) in res.items():
            print(f"[{mode}] claude agent run (run → end notice, one agent): {summary(agents)}")
            print(f"[{mode}] trivial run (runner start included): {summary(runs)}")
        d_agent = statistics.median(res["bwrap"][0]) - statistics.median(res["none"][0])
        d_run = statistics.median(res["bwrap"][1]) - statistics.median(res["none"][1])
        print(f"sandbox cost: {d_agent:+.1f} ms per agent, {d_run:+.1f} ms per runner (medians)")
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=50)
    p.add_argument("--agents", type=int, default=50, help="agent runs per mode (median of these)")
    p.add_argument("--before", help="a checkout of the code before issue 20, for the alternated comparison")
    a = p.parse_args()
    trio.run(main, a.n, a.agents, a.before)
