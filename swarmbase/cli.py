"""`swarmbase` / `python -m swarmbase`: serve (default), add-caller NAME, reload, check-config,
admin-link LOGIN, audit RUN_ID, usage. audit and usage only read the state dir (the config's
folder): they work without a valid config and beside a running daemon."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from functools import partial

import trio

from . import config, defaults
from .statelock import LockHeld, StateLock


def _serve(port: int | None = None) -> int:
    # Until the daemon takes SIGHUP as a reload (live_reload.Hangups, installed before boot
    # and before any child starts, so children get the default back), a SIGHUP in these
    # first moments is ignored rather than fatal.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    path = config.config_path()
    if not path.exists():
        print(defaults.write_default(path, port or defaults.DEFAULT_PORT), file=sys.stderr, flush=True)
    try:
        cfg = config.load(path)
    except config.ConfigError as e:
        print(f"swarmbase: bad config: {e}", file=sys.stderr)
        return 2
    if port is not None and port != cfg.port:
        # One place says the port: the client and add-caller read it from the config too.
        print(f"swarmbase: --port {port} differs from the port in {path} ({cfg.port}); --port only chooses the "
              f"port of a first start: change \"port\" in the config instead", file=sys.stderr)
        return 2
    from . import install_check
    if (missing := install_check.problem()) is not None:
        print(f"swarmbase: cannot start: {missing}", file=sys.stderr)
        return 2
    import shutil
    if not shutil.which("node"):
        print("swarmbase: cannot start: node (20 or newer) must be on PATH; scripts run in a Node child process",
              file=sys.stderr)
        return 2

    # Only serving needs the daemon (quart, the supervisor: ~0.6 CPU-s of imports, several
    # seconds on a loaded machine): `reload` and the other commands must not pay for it.
    from . import daemon
    from .launch.local import SandboxUnavailable
    try:
        lock = StateLock(cfg.state_dir).acquire()     # first: before runs are read or groups reaped
    except LockHeld as e:
        print(f"swarmbase: {e}", file=sys.stderr)
        return 1

    async def main() -> None:
        async with trio.open_nursery() as n:
            url, _ = await n.start(partial(daemon.serve, cfg, locked=True))
            daemon.print_ready(url, cfg)

    try:
        trio.run(main)
    except (OSError, SandboxUnavailable) as e:
        print(f"swarmbase: cannot start: {e}", file=sys.stderr)
        return 1
    except BaseExceptionGroup as eg:
        oserr = eg.subgroup(lambda e: isinstance(e, (OSError, SandboxUnavailable)))
        if oserr is None:
            raise
        print(f"swarmbase: cannot start: {oserr.exceptions[0]}", file=sys.stderr)
        return 1
    finally:
        lock.release()
    return 0


def _add_syslog() -> None:
    import logging.handlers
    import os
    for address in ("/var/run/syslog", "/dev/log"):
        if os.path.exists(address):
            handler = logging.handlers.SysLogHandler(address=address)
            handler.setFormatter(logging.Formatter("swarmbase[%(process)d]: %(levelname)s %(name)s: %(message)s"))
            logging.getLogger().addHandler(handler)
            return
    logging.getLogger("swarmbase").warning("--syslog: no system log socket found; logging to stderr only")


def _admin_link(login: str) -> int:
    from . import admin
    try:
        cfg = config.load(config.config_path())
    except config.ConfigError as e:
        print(f"swarmbase: bad config: {e}", file=sys.stderr)
        return 2
    if login not in cfg.dashboard.adminLogins:
        print(f"swarmbase: {login!r} is not listed in dashboard.adminLogins; add it to the config first",
              file=sys.stderr)
        return 2
    token = admin.AdminStore(cfg.state_dir).create_link(login)
    print(admin.link_url(cfg.publicUrl, cfg.port, token))
    print(f"swarmbase: open it within {admin.LINK_TTL_S // 60} minutes in the browser signed in to the tailnet "
          f"as {login}; it works once, and the session lasts {admin.SESSION_TTL_S // 3600} hours", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="swarmbase", description="SwarmBase daemon")
    sub = parser.add_subparsers(dest="cmd")
    serve = sub.add_parser("serve", help="run the daemon (the default)")
    serve.add_argument("--syslog", action="store_true",
                       help="also log to the system log (the unified log on macOS, the journal on Linux)")
    for p in (parser, serve):
        p.add_argument("--port", type=_port, default=argparse.SUPPRESS,
                       help="the port a first start writes into the config (default 7360)")
    add = sub.add_parser("add-caller", help="create a caller's token and key file and add it to the config")
    add.add_argument("name")
    rel = sub.add_parser("reload", help="make the running daemon re-read its config (the same as SIGHUP)")
    rel.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the daemon's answer")
    sub.add_parser("check-config", help="validate the config and exit")
    link = sub.add_parser("admin-link", help="print a one-time link that signs a browser in as a dashboard admin")
    link.add_argument("login", help="a login listed in dashboard.adminLogins")
    audit = sub.add_parser("audit", help="a run's tree (and what it resumed or nested) with every hash chain verified")
    audit.add_argument("run_id", metavar="RUN_ID")
    audit.add_argument("--json", action="store_true", help="print JSON instead of the text tree")
    audit.add_argument("--expect-hash", metavar="HASH",
                       help="also check that the run's end record has this hash (the endHash of its run-end notice)")
    usage = sub.add_parser("usage", help="spend per day, caller, engine and model, from the agent records")
    usage.add_argument("--from", dest="start", metavar="YYYY-MM-DD", help="first day (UTC); default 29 days before --to")
    usage.add_argument("--to", dest="end", metavar="YYYY-MM-DD", help="last day (UTC), inclusive; default today")
    usage.add_argument("--caller", metavar="NAME", help="only this caller")
    usage.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    if hasattr(args, "port") and args.cmd not in (None, "serve"):
        parser.error("--port is for starting the daemon (serve), not for " + args.cmd)
    if args.cmd == "audit":
        from .audit.render import audit_command
        return audit_command(config.config_path().parent, args.run_id, args.json, expect_hash=args.expect_hash)
    if args.cmd == "usage":
        from .usage import usage_command
        return usage_command(config.config_path().parent, args.start, args.end, args.caller, args.json)
    logging.basicConfig(level=logging.INFO, format="swarmbase: %(levelname)s %(name)s: %(message)s")
    # httpx and httpcore say every request at INFO: one line per model request of every
    # think or read agent, in-daemon, which cost the daemon CPU and buried what matters.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if getattr(args, "syslog", False):
        _add_syslog()
    if args.cmd == "reload":
        from .reload_cli import reload_command
        return reload_command(config.config_path().parent, args.timeout)
    if args.cmd == "add-caller":
        try:
            print(defaults.add_caller(config.config_path(), args.name))
        except config.ConfigError as e:
            print(f"swarmbase: {e}", file=sys.stderr)
            return 2
        # A running daemon serves the new caller at once: the same reload as SIGHUP.
        from .reload_cli import daemon_pid, request_reload
        state = config.config_path().parent
        if daemon_pid(state) is None:
            print("swarmbase: no daemon is running; it serves the new caller when it starts", file=sys.stderr)
            return 0
        code, message = request_reload(state, 60.0)
        print(f"swarmbase: {message}", file=sys.stderr)
        return code
    if args.cmd == "admin-link":
        return _admin_link(args.login)
    if args.cmd == "check-config":
        try:
            cfg = config.load(config.config_path())
        except config.ConfigError as e:
            print(f"swarmbase: bad config: {e}", file=sys.stderr)
            return 2
        problems = config.key_file_problems(cfg)
        for name, problem in problems:
            print(f"swarmbase: caller {name}: {problem}; its runs are refused until it is fixed", file=sys.stderr)
        unfilled = config.key_files_unfilled(cfg)
        for name, problem in unfilled:
            print(f"swarmbase: caller {name}: {problem}; its agents fail until then", file=sys.stderr)
        print("swarmbase: config ok" + (" (but see the key files above)" if problems or unfilled else ""))
        return 1 if problems or unfilled else 0
    return _serve(getattr(args, "port", None))


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (1-65535)")
    return port
