"""Equal latency: wheel's CPU per fire against the poller's at the poll
interval whose p99 lag matches wheel's at its default tick (issue 49's
target: at most 0.7x the poller's total on SQLite, 0.5x on PostgreSQL).

A run's total is its CPU per 1,000 fires on the node (or poller), its
workers and the database's backends. The poller's p99 grows with its
interval, about one for one; when none of the intervals asked for lands
within ``TOLERANCE`` of wheel's p99, ``next_poll_interval`` picks one more to
try, between the two that straddle it, or beyond the shortest (longest) by
what its p99 is over (under) -- at most halving (doubling) it, and never
below ``MIN_INTERVAL_MS``: on a loaded machine a short interval's p99 can
come out above a longer one's, and a poller polling every millisecond
takes the machine's CPU and measures nothing."""

from __future__ import annotations

from typing import Any

TOLERANCE = 0.10  # the poller's p99 within 10% of wheel's
MATCH_STEPS = 4  # at most this many more poller runs aiming at wheel's p99
TARGETS = {"sqlite": 0.7, "postgres": 0.5}
MIN_INTERVAL_MS = 5


def total_cpu(run: dict[str, Any]) -> float:
    """CPU s per 1,000 fires: node or poller, workers and the database."""
    return float(run["cpu_s_per_1k"]) + float(run.get("db_cpu_s_per_1k") or 0.0)


def _near(p99: float, target: float) -> bool:
    return abs(p99 - target) <= TOLERANCE * target


def next_poll_interval(target_p99: float, polls: list[dict[str, Any]]) -> int | None:
    """The poll interval (ms) to run next so its p99 lands on
    ``target_p99``; None when a run already did, or there is nothing new to try."""
    if not polls or any(_near(r["lag_p99_ms"], target_p99) for r in polls):
        return None
    by_interval = sorted(polls, key=lambda r: r["poll_interval_ms"])
    below = [r for r in by_interval if r["lag_p99_ms"] < target_p99]
    above = [r for r in by_interval if r["lag_p99_ms"] > target_p99]
    if below and above:
        lo, hi = below[-1], above[0]
        span = hi["lag_p99_ms"] - lo["lag_p99_ms"]
        share = (target_p99 - lo["lag_p99_ms"]) / span
        guess = lo["poll_interval_ms"] + share * (hi["poll_interval_ms"] - lo["poll_interval_ms"])
    elif above:  # every interval too slow: shorten the shortest by what it is over
        first = above[0]
        over = first["lag_p99_ms"] - target_p99
        guess = max(first["poll_interval_ms"] / 2, first["poll_interval_ms"] - over)
    else:  # every interval too quick: lengthen the longest by what it is under
        last = below[-1]
        under = target_p99 - last["lag_p99_ms"]
        guess = min(last["poll_interval_ms"] * 2, last["poll_interval_ms"] + under)
    interval = max(MIN_INTERVAL_MS, round(float(guess)))
    if any(r["poll_interval_ms"] == interval for r in polls):
        return None
    return interval


def figure(runs: list[dict[str, Any]], store: str, default_tick_ms: int) -> dict[str, Any] | None:
    """wheel at its default tick against the poller run on ``store`` whose p99
    came nearest wheel's; None without both."""
    wheels = [
        r
        for r in runs
        if r["store"] == store and r["system"] == "wheel" and r.get("tick_ms") == default_tick_ms
    ]
    polls = [r for r in runs if r["store"] == store and r["system"] == "poll"]
    if not wheels or not polls:
        return None
    w = wheels[0]
    p = min(polls, key=lambda r: abs(r["lag_p99_ms"] - w["lag_p99_ms"]))
    wheel_cpu, poll_cpu = total_cpu(w), total_cpu(p)
    out: dict[str, Any] = {
        "wheel_tick_ms": default_tick_ms,
        "wheel_lag_p99_ms": w["lag_p99_ms"],
        "wheel_total_cpu_s_per_1k": round(wheel_cpu, 4),
        "poll_interval_ms": p["poll_interval_ms"],
        "poll_lag_p99_ms": p["lag_p99_ms"],
        "poll_total_cpu_s_per_1k": round(poll_cpu, 4),
        "within_10pct": _near(p["lag_p99_ms"], w["lag_p99_ms"]),
        "cpu_ratio": round(wheel_cpu / poll_cpu, 3) if poll_cpu else float("nan"),
    }
    if store in TARGETS:
        out["target"] = TARGETS[store]
    return out
