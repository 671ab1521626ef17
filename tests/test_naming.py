"""What a run is called (swarmbase/runs/naming.py): one rule for notices, the list and
status tools and the dashboard; never a line of code."""

from __future__ import annotations

import html
import json
import re

import httpx
import pytest
import trio

from swarmbase import money
from swarmbase.client import connect
from swarmbase.runs import naming

from .conftest import Env


@pytest.mark.parametrize("script,comment", [
    ("// Review the open PRs\nreturn 1", "Review the open PRs"),
    ("\n\n  //   triage   \nreturn 1", "triage"),
    ("//\n// \n// Nightly digest\nphase('x')", "Nightly digest"),       # bare markers skipped
    ("phase('x');\n// a comment after code\nreturn 1", None),           # code first: no name from it
    ("export const meta = {name: 'x'};\n// later", None),
    ("/* block */\nreturn 1", None),
    ("", None),
    ("// \x1b[31mred\x07 title", "[31mred  title"),                   # no control characters
    ("// " + "w" * 200, "w" * naming.MAX_NAME_CHARS),
])
def test_leading_comment(script: str, comment: str | None) -> None:
    assert naming.leading_comment(script) == comment


def test_the_rule_label_then_meta_then_comment_then_a_neutral_word() -> None:
    assert naming.run_name("nightly", {"name": "meta"}, "comment") == "nightly"
    assert naming.run_name(None, {"name": "meta"}, "comment") == "meta"
    assert naming.run_name(None, {"name": "  "}, "comment") == "comment"
    assert naming.run_name(None, {"name": 7}, None) == naming.UNNAMED
    assert naming.run_name("", None, None) == naming.UNNAMED == "untitled"


def test_money_has_one_precision() -> None:
    assert money.usd(0.00005) == "$0.0001" and money.usd(0.00004999) == "$0.0000"    # half up
    assert money.usd(1.23456) == "$1.2346" and money.usd(None) == "$0.0000" and money.usd(float("nan")) == "$0.0000"
    assert money.usd(-0.5) == "-$0.5000" and money.usd(12) == "$12.0000"
    # A total is the exact sum rounded once: three $0.00046 rows show $0.0005 each, total $0.0014.
    assert money.total([0.00046, 0.00046, 0.00046]) == "$0.0014" == money.usd(0.00138)


SCRIPTS = {
    "comment": ("// Summarise the changelog\nphase('read');\nreturn 1", "Summarise the changelog"),
    "meta": ("export const meta = {name: 'weekly review'};\n// not this\nreturn 2", "weekly review"),
    "code": ("phase(\"x\");\nreturn 3", "untitled"),
}


async def test_notices_tools_and_dashboard_use_the_same_name(running: Env) -> None:
    names: dict[str, str] = {}
    with trio.fail_after(60):
        async with connect(running.ws, running.tokens["alice"]) as h:
            await h.handshake()
            for kind, (script, expected) in SCRIPTS.items():
                run_id = (await h.tool("run", {"script": script}))["structuredContent"]["runId"]
                notice = await h.wait_notice(f"{run_id}:end")
                text = notice["payload"]["content"][0]["text"]
                assert text.startswith(f"Run {json.dumps(expected)} ({run_id}) completed"), text
                names[run_id] = expected
            listed = {r["runId"]: r["label"] for r in (await h.tool("list"))["structuredContent"]["runs"]}
            assert listed == names
            for run_id, expected in names.items():
                st = (await h.tool("status", {"runId": run_id}))["structuredContent"]
                assert st["label"] == expected
        async with httpx.AsyncClient(base_url=running.url) as c:
            page = (await c.get("/")).text
            for run_id, expected in names.items():
                assert f'<a href="/runs/{run_id}">{html.escape(expected)}</a>' in page
                run_page = (await c.get(f"/runs/{run_id}")).text
                title = re.search(r"<title>(.*?)</title>", run_page, re.S).group(1)
                assert expected in html.unescape(title)
    assert "phase(" not in " ".join(names.values())
