"""SwarmBase: a workflow orchestrator daemon for AI agents, speaking MCPL."""

__version__ = "0.1.0"
