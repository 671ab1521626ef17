"""The deterministic model (model.py), counting every HTTP request it is sent, whatever
its path: the peer bench (bench/peer_workflow.py) reports requests per run, and a CLI
may call more than /v1/messages (a 404 here is still a request a runtime made).

`kinds()` splits the count: `main` (main-session turns of the peer's `claude -p`, the
requests offering the Workflow tool), `agents` (every other Messages request: an
agent() of either runtime), `other` (any other path).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import attrs
from quart import request

from .model import DeterministicModel


@attrs.define
class CountedModel(DeterministicModel):
    paths: Counter[str] = attrs.Factory(Counter)       # request path -> requests so far

    def app(self) -> Any:
        app = super().app()

        @app.before_request
        async def count() -> None:
            self.paths[request.path] += 1

        return app

    def kinds(self) -> dict[str, int]:
        total = sum(self.paths.values())
        main, agents = self.main_requests, len(self.subagent_requests)
        return {"total": total, "main": main, "agents": agents, "other": total - main - agents}
