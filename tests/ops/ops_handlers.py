"""Handlers the operations tests' worker processes run."""

from __future__ import annotations

import time

from wheel.worker import Permanent, RunContext


def hang(ctx: RunContext) -> None:
    """Holds its run until the process is killed."""
    time.sleep(3600)


def fail(ctx: RunContext) -> None:
    raise Permanent(f"no good: {ctx.idempotency_key}")
