"""What runs on a Ray node: the body of one agent's streaming task, the boot reaper and
the node probe. Shipped in the same wheel as the daemon and imported by Ray workers by
name (`swarmbase.node.agent.run_agent`), so a node needs `pip install 'swarmbase[ray]'`
of the daemon's version.

Plain synchronous code on purpose (no trio): a Ray task body runs on the worker's task
thread, and what it must do is small — make the agent's private dir, start the CLI in its
own session under a guardian, stream raw lines back, and kill the group however the task
ends. The daemon keeps everything else (idle watchdog, transcript, verdict, costs).

Layout of a node's state dir (SWARMBASE_NODE_DIR, default ~/.swarmbase-node):
    procs/<owner>/<boot>/<key>.json   one record per running agent (for the reaper)
    homes/<owner>/<boot>/<key>/       the agent's private dir: HOME, TMPDIR, prompt
    work/<owner>/<boot>/<key>/        a shipped workspace (when the cwd is not shared)
`owner` names one daemon (its state dir), `boot` one life of it: a daemon's reaper kills
what its own earlier lives left, never another daemon's agents.
"""
