"""The peer: Claude Code's own Workflow runtime, driven headless, and the same calls run
through a SwarmBase daemon, both against one deterministic fake model — the differential
conformance suite (tests/test_conformance.py) and the peer bench (bench/) share it.

- model.DeterministicModel: the fake Messages API (answers derived from the prompt text).
- claude_code.ClaudeCodePeer: runs a Workflow call through `claude -p`, reads its record.
- daemon_side.swarmbase_daemon: a real daemon process; SwarmBaseDaemon.run does the same
  call through the `run` tool.
- counted_model.CountedModel: the same fake, counting every request (the bench's figures).
"""
