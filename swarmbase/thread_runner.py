"""The shape of trio.to_thread.run_sync, for pieces that run blocking steps in a worker
thread and take the runner as a parameter (tests pass one that runs them inline). Kept
outside runs/, which forbids a bare `Any`: the runner is as generic as the function it runs."""

from collections.abc import Awaitable, Callable
from typing import Any

ThreadRunner = Callable[..., Awaitable[Any]]
