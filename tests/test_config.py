"""Config loading: every fault stops start-up with one message naming the key path."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from swarmbase import config

H1 = "a" * 64
H2 = "b" * 64


def load(tmp_path: Path, text: str) -> config.Config:
    p = tmp_path / "config.json"
    p.write_text(text)
    return config.load(p)


def fault(tmp_path: Path, cfg: dict | str) -> str:
    text = cfg if isinstance(cfg, str) else json.dumps(cfg)
    with pytest.raises(config.ConfigError) as ei:
        load(tmp_path, text)
    return str(ei.value)


def test_defaults_for_every_key(tmp_path: Path) -> None:
    cfg = load(tmp_path, "{}")
    assert cfg.port == 7360
    # Claude Code's Workflow limits (issue 21): 16 at once, 1,000 agents per run.
    assert cfg.maxConcurrentAgents == 16 and cfg.perRunConcurrency == 16 and cfg.maxAgentsPerRun == 1000
    assert cfg.publicUrl is None and cfg.engines.claude is None and cfg.engines.codex is None
    assert cfg.dashboard.adminLogins == [] and cfg.callers == [] and cfg.prices == {}
    assert cfg.deleteWorkOnEnd is True and cfg.resumeInterruptedOnBoot is False
    assert cfg.state_dir == tmp_path


def test_spec_example_with_comments_and_aliases(tmp_path: Path) -> None:
    key = tmp_path / "resident-a.key"
    key.write_text("sk-test")
    os.chmod(key, 0o600)
    fake_bin = tmp_path / "claude"
    fake_bin.write_text("#!/bin/sh\n")
    os.chmod(fake_bin, 0o755)
    files = tmp_path / "files"
    files.mkdir()
    text = f"""{{
      "port": 7361,  // the daemon's port
      "publicUrl": "https://m.tailnet.ts.net:7360",  /* used in links */
      "claudeBin": "{fake_bin}", "apiBaseUrl": "https://gw/anthropic",
      "maxConcurrentAgents": 10, "perRunConcurrency": 8, "maxAgentsPerRun": 200,
      "dashboard": {{ "adminLogins": ["you@example.com"] }},
      "callers": [{{
        "name": "resident-a", "tokenSha256": "{H1}",
        "apiKeyFile": "{key}", "engines": ["claude"], "maxProfile": "read",
        "cwdRoots": ["{files}"], "defaultModel": "claude-sonnet-5-5",
        "runUsdDefault": 5, "runUsdMax": 25, "maxActiveRuns": 3,
        "runTokensDefault": 10000000, "runTokensMax": 30000000
      }}],
      "prices": {{ "gpt-x": {{"input": 1.25, "output": 10}} }}
    }}"""
    cfg = load(tmp_path, text)
    assert cfg.port == 7361
    assert cfg.engines.claude.bin == str(fake_bin)
    assert cfg.engines.claude.baseUrl == "https://gw/anthropic"
    c = cfg.callers[0]
    assert c.defaultModels.claude == "claude-sonnet-5-5"
    assert c.cwdRoots == [os.path.realpath(files)]
    assert cfg.prices["gpt-x"].output == 10.0


def test_tilde_expansion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    key = home / "k.key"
    key.write_text("x")
    os.chmod(key, 0o600)
    cfg = load(tmp_path, json.dumps({"callers": [{"name": "a", "tokenSha256": H1, "apiKeyFile": "~/k.key",
                                                   "cwdRoots": ["~"]}]}))
    assert cfg.callers[0].apiKeyFile == str(key)
    assert cfg.callers[0].cwdRoots == [os.path.realpath(home)]


def test_cwd_roots_may_not_contain_the_state_dir(tmp_path: Path) -> None:
    for root in (str(tmp_path), "/", str(tmp_path / "homes")):
        msg = fault(tmp_path, {"callers": [{"name": "a", "tokenSha256": H1, "cwdRoots": [root]}]})
        assert "callers[0].cwdRoots[0]" in msg and "contains the daemon's state dir or homesDir" in msg
    elsewhere = tmp_path / "h"
    msg = fault(tmp_path, {"homesDir": str(elsewhere / "x"), "callers": [{"name": "a", "tokenSha256": H1,
                                                                          "cwdRoots": [str(elsewhere)]}]})
    assert "contains the daemon's state dir or homesDir" in msg


def test_unknown_key_suggests_nearest(tmp_path: Path) -> None:
    msg = fault(tmp_path, {"callers": [{"name": "a", "tokenSha256": H1, "maxProfil": "read"}]})
    assert "callers[0].maxProfil: unknown key" in msg and "'maxProfile'" in msg
    assert "perRunConcurency: unknown key (did you mean 'perRunConcurrency'?)" in fault(tmp_path, {"perRunConcurency": 2})


def test_wrong_type(tmp_path: Path) -> None:
    assert "port: must be a number, got a string" in fault(tmp_path, {"port": "7360"})
    assert "dashboard.adminLogins: must be an array" in fault(tmp_path, {"dashboard": {"adminLogins": "me"}})
    assert "deleteWorkOnEnd: must be true or false" in fault(tmp_path, {"deleteWorkOnEnd": 1})


def test_out_of_range(tmp_path: Path) -> None:
    assert "port: must be between 0 and 65535, got 70000" in fault(tmp_path, {"port": 70000})
    assert "maxConcurrentAgents: must be between 1 and 1000, got 0" in fault(tmp_path, {"maxConcurrentAgents": 0})
    msg = fault(tmp_path, {"callers": [{"name": "a", "tokenSha256": H1, "runUsdDefault": 30, "runUsdMax": 25}]})
    assert "callers[0].runUsdDefault: 30 is above runUsdMax 25" in msg


def test_bad_enum_and_pattern(tmp_path: Path) -> None:
    assert "callers[0].maxProfile: must be one of" in fault(
        tmp_path, {"callers": [{"name": "a", "tokenSha256": H1, "maxProfile": "admin"}]})
    assert "callers[0].tokenSha256: 'abc' does not match" in fault(
        tmp_path, {"callers": [{"name": "a", "tokenSha256": "abc"}]})


def test_a_bad_key_file_is_that_callers_problem_not_a_config_fault(tmp_path: Path) -> None:
    # Issue 25 #7: a missing or world-readable key file no longer stops start-up; the
    # config loads and the problem (naming the file) is that caller's alone.
    open_key, good_key, not_a_file = tmp_path / "b.key", tmp_path / "c.key", tmp_path / "d.key"
    open_key.write_text("x")
    os.chmod(open_key, 0o644)
    good_key.write_text("x")
    os.chmod(good_key, 0o600)
    not_a_file.mkdir()
    cfg = load(tmp_path, json.dumps({"callers": [
        {"name": "a", "tokenSha256": H1, "apiKeyFile": str(tmp_path / "nope.key")},
        {"name": "b", "tokenSha256": H2, "apiKeyFile": str(open_key)},
        {"name": "c", "tokenSha256": "c" * 64, "apiKeyFile": str(good_key)},
        {"name": "d", "tokenSha256": "d" * 64, "apiKeyFile": str(not_a_file)},
        {"name": "e", "tokenSha256": "e" * 64}]}))
    problems = dict(config.key_file_problems(cfg))
    assert sorted(problems) == ["a", "b", "d"]
    assert problems["a"] == f"the key file {tmp_path / 'nope.key'} does not exist"
    assert problems["b"] == f"the key file {open_key} must be mode 0600 (it is 0644); run: chmod 600 {open_key}"
    assert problems["d"] == f"the key file {not_a_file} is not a regular file"
    os.chmod(open_key, 0o600)                 # fixed: no reload needed
    assert config.key_file_problem(cfg.caller("b").apiKeyFile) is None


def test_duplicate_names_and_hashes(tmp_path: Path) -> None:
    msg = fault(tmp_path, {"callers": [{"name": "a", "tokenSha256": H1}, {"name": "a", "tokenSha256": H2}]})
    assert "callers[1].name: duplicate caller name 'a'" in msg
    msg = fault(tmp_path, {"callers": [{"name": "a", "tokenSha256": H1}, {"name": "b", "tokenSha256": H1}]})
    assert "callers[1].tokenSha256: the same token hash as callers[0]" in msg


def test_engine_bin_not_found(tmp_path: Path) -> None:
    msg = fault(tmp_path, {"engines": {"claude": {"bin": "definitely-not-a-claude-bin"}}})
    assert "engines.claude.bin: 'definitely-not-a-claude-bin' was not found on PATH" in msg
    msg = fault(tmp_path, {"engines": {"claude": {"bin": str(tmp_path / "missing")}}})
    assert "engines.claude.bin:" in msg and "does not exist" in msg


def test_bare_bin_resolved_on_path(tmp_path: Path) -> None:
    b = tmp_path / "bin"
    b.mkdir()
    (b / "claude").write_text("#!/bin/sh\n")
    os.chmod(b / "claude", 0o755)
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"engines": {"claude": {"bin": "claude"}}, "sandbox": "none"}))
    cfg = config.load(p, search_path=str(b))
    assert cfg.engines.claude.bin == str(b / "claude")


def test_missing_required_and_bad_json(tmp_path: Path) -> None:
    assert "callers[0].tokenSha256: required key is missing" in fault(tmp_path, {"callers": [{"name": "a"}]})
    assert "not valid JSON" in fault(tmp_path, "{ port: 1 }")
    assert "must be a JSON object" in fault(tmp_path, "[]")


def test_caller_engine_not_configured(tmp_path: Path) -> None:
    msg = fault(tmp_path, {"callers": [{"name": "a", "tokenSha256": H1, "engines": ["codex"]}]})
    assert "callers[0].engines[0]: engine 'codex' is not configured" in msg


def test_error_names_the_file(tmp_path: Path) -> None:
    assert str(tmp_path / "config.json") in fault(tmp_path, {"port": -1})


def test_config_path_env(tmp_path: Path) -> None:
    assert config.config_path({"SWARMBASE_CONFIG": str(tmp_path / "c.json")}) == tmp_path / "c.json"
    assert config.config_path({"HOME": "/h"}).name == "config.json"


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox user applies only to a daemon run as root")
def test_the_sandbox_user_may_not_be_root(tmp_path: Path) -> None:
    assert "unprivileged user" in fault(tmp_path, {"sandboxUser": "root"})
    assert "no user named" in fault(tmp_path, {"sandboxUser": "nobody-at-all"})
    assert load(tmp_path, '{"sandboxUser": "nobody"}').sandboxUser == "nobody"


def test_homes_under_a_system_dir_every_sandbox_mounts_is_refused(tmp_path: Path) -> None:
    assert "under a system dir every sandbox mounts" in fault(tmp_path, {"homesDir": "/usr/local/var/homes"})
