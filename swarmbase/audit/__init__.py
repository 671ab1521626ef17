"""The audit trail: hash chains over a run's records, the walk over a run tree, and the
`audit` command.

- `chain`   pure logic: canonical bytes, links, sealing entries, verifying one chain.
- `seal`    what the core calls to seal records as it writes them (no file I/O of its own).
- `rundirs` read-only access to run dirs: the run index, agent records, chains picked up
            from disk (to seal a run a dead daemon left), file digests.
- `verify`  reads a run dir and verifies every chain in it against the run's end record.
- `tree`    reads a run and everything it resumed or nested into one tree with totals.
- `render`  the `audit` command: text or JSON, exit 0 intact / 1 broken.
"""
