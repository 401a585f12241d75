"""Handlers the end-to-end tests' worker processes run."""

from __future__ import annotations

import os

from wheel.worker import RunContext


def record(ctx: RunContext) -> None:
    """Append the run to the file named by WHEEL_E2E_OUT (one line per run)."""
    with open(os.environ["WHEEL_E2E_OUT"], "a") as f:
        f.write(f"{ctx.idempotency_key} {ctx.attempt} {ctx.fence} {ctx.run_id}\n")
