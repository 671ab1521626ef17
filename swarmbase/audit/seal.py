"""What the core calls to seal a run's records as it writes them. No file I/O here: the
core keeps writing with fsutil (docs/audit-integration.md has every call site).

One `RunChains` per run, made when the run starts (or picked up from its files with
`rundirs.chains_from_disk` after a restart):

    chains = RunChains.start(run_id, script_text, resumed_from=old.id, resumed_end=old.end)
    fsutil.append_bytes(journal_path, chains.journal.seal_line(entry))
    fsutil.append_bytes(log_path, chains.log.seal_line(entry))
    fsutil.write_json(agent_json, chains.agent_record(n, rec.to_json(), files))
    run.end = chains.end_record(run.to_json(), rundirs.end_files(run_dir))
"""

from __future__ import annotations

import hashlib
from typing import Any

from . import chain

JOURNAL = "journal.jsonl"
LOG = "log.jsonl"
# The facts of a run that its end record fixes (run.json keys).
END_FACTS = ("id", "caller", "status", "createdAt", "endedAt", "label", "budgetUsd", "budgetTokens",
             "spentUsd", "spentEstimated", "spentTokens", "agentsTotal", "agentsDone", "error", "errorLine",
             "resumedFrom")


def file_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class RunChains:
    def __init__(self, link: dict[str, Any]) -> None:
        self.link = link
        self.link_hash = chain.link_hash(link)
        self.journal = chain.ChainWriter(JOURNAL, chain.chain_start(self.link_hash, JOURNAL))
        self.log = chain.ChainWriter(LOG, chain.chain_start(self.link_hash, LOG))
        self.agents: dict[int, str] = {}         # n -> hash of its sealed final record

    @classmethod
    def start(cls, run_id: str, script: str, *, resumed_from: str | None = None,
              resumed_end: dict[str, Any] | None = None, nested_in: dict[str, Any] | None = None) -> "RunChains":
        """A new run's chains. `resumed_end` is the old run's end record (None if it had
        none: an unchained run); `nested_in` is {"runId", "workflow", "after": parent link hash}."""
        after = resumed_end.get("hash") if isinstance(resumed_end, dict) else None
        return cls(chain.run_link(run_id, file_sha256(script.encode()), resumed_from=resumed_from,
                                  resumed_end_hash=after, nested_in=nested_in))

    @classmethod
    def resume(cls, link: dict[str, Any], journal: bytes, log: bytes, agents: dict[int, bytes]) -> "RunChains":
        """Chains picked up from the files on disk: after a restart, to seal a run the dead
        daemon left in flight. Agent records without a hash (not final) are left out."""
        rc = cls(link)
        rc.journal = chain.ChainWriter.resume(JOURNAL, rc.journal.start, journal)
        rc.log = chain.ChainWriter.resume(LOG, rc.log.start, log)
        for n, data in agents.items():
            w = chain.ChainWriter.resume(chain.agent_chain(n), "", data)
            if w.last is not None:
                rc.agents[n] = w.last
        return rc

    def agent_start(self, n: int) -> str:
        return chain.chain_start(self.link_hash, chain.agent_chain(n))

    def agent_record(self, n: int, record: dict[str, Any], files: dict[str, str] | None = None) -> dict[str, Any]:
        """The agent's final record, sealed. `files`: sha256 of its prompt.txt, opts.json,
        transcript.jsonl as written (verified by `audit` when present)."""
        body = {**record, "files": dict(files)} if files else record
        sealed = chain.seal(body, self.agent_start(n))
        self.agents[n] = sealed["hash"]
        return sealed

    def chains(self) -> dict[str, str | None]:
        out: dict[str, str | None] = {JOURNAL: self.journal.last, LOG: self.log.last}
        for n in sorted(self.agents):
            out[chain.agent_chain(n)] = self.agents[n]
        return out

    def end_record(self, run_json: dict[str, Any], files: dict[str, str]) -> dict[str, Any]:
        """Seal the run: `run_json` is Run.to_json() after the final status is set (only
        END_FACTS are kept), `files` the sha256 of script.js and result.json (if any).
        Nothing may be appended to the run's chains after this."""
        facts = {k: run_json.get(k) for k in END_FACTS if k in run_json}
        return chain.end_record(run=facts, link=self.link, chains=self.chains(), files=files)
