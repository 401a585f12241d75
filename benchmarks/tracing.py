"""What tracing costs: the CPU per fire of a node and a worker with
OpenTelemetry tracing on (every span made and handed to an exporter that
sends nothing, ``OTEL_TRACES_EXPORTER=null``) against the same with tracing
off, in one run.

    python benchmarks/tracing.py --rate 2000 --duration 20 --json out.json
    python benchmarks/tracing.py --rate 2000 --duration 20 --rounds 3 --json out.json
    python benchmarks/tracing.py --smoke --json out.json

Two phases of ``http_targets.py``'s ``noop`` phase, one after the other, each
on a fresh node with one worker and the same jobs: one-shot jobs of a Python
no-op handler coming due at ``--rate`` per second over ``--duration``
seconds. ``off`` runs the node and the worker as they are; ``on`` runs them
with ``OTEL_TRACES_EXPORTER=null``: a server span of each API call (the bulk
submits before the window), a ``dispatch`` span of each fire on the node
and a ``run`` span on the worker. CPU is utime + stime of the node and the
worker over the measured window, per 1,000 fires delivered (see
``http_targets.py``); ``cpu_ratio_traced`` is ``on``'s over ``off``'s.

On a machine that other work shares, a phase's CPU per fire moves with the
load around it. ``--rounds N`` measures N pairs of phases, in the order off,
on, on, off, off, on... (a drift of the load weighs on both alike), and
reports each pair's ratio (``cpu_ratio_traced_rounds``) and the median of
the pairs whose phases delivered every fire once with the window unhurt by
the submission (``rounds_whole``): ``cpu_ratio_traced``, and that pair's
phases as ``off`` and ``on``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _report
from http_targets import Config, run_phase

TRACED = (("OTEL_TRACES_EXPORTER", "null"),)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rate", type=float, default=2000.0, help="fires per second coming due")
    p.add_argument("--duration", type=float, default=20.0, help="measured window, seconds")
    p.add_argument("--drain", type=float, default=5.0, help="seconds after the window")
    p.add_argument("--capacity", type=int, default=1000, help="the worker's --capacity")
    p.add_argument("--rounds", type=int, default=1, help="pairs of phases, alternating (median)")
    p.add_argument("--json", type=Path, help="write the result here")
    p.add_argument(
        "--smoke", action="store_true", help="a quick run: --rate 50 --duration 2 --drain 5"
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.rate, args.duration, args.drain = 50.0, 2.0, 5.0
    cfg = Config(
        rate=args.rate, duration_s=args.duration, drain_s=args.drain, capacity=args.capacity,
        body_bytes=256, http_timeout_ms=10_000, serve_args=(), store="default", receiver="lean",
    )  # fmt: skip
    configs = {"off": cfg, "on": replace(cfg, env=TRACED)}
    tmp = Path(tempfile.mkdtemp(prefix="wheel-bench-tracing-"))
    try:
        rounds: list[dict[str, dict[str, Any]]] = []
        for i in range(max(1, args.rounds)):
            results: dict[str, dict[str, Any]] = {}
            for name in ("off", "on") if i % 2 == 0 else ("on", "off"):
                where = tmp / f"{name}-{i}"
                where.mkdir()
                results[name] = run_phase("noop", configs[name], where)
            rounds.append(results)
    finally:
        if os.environ.get("WHEEL_BENCH_KEEP"):
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    _report.emit(report(cfg, rounds), args.json)
    return 0


def _ratio(results: dict[str, dict[str, Any]]) -> float | None:
    off, on = results["off"]["cpu_s_per_1k"], results["on"]["cpu_s_per_1k"]
    return round(on / off, 3) if off else None


def _whole(results: dict[str, dict[str, Any]]) -> bool:
    """Whether both phases delivered every fire once, the window unhurt by
    the submission (a phase that fell behind measures something else)."""
    return all(
        not phase["lost"] and not phase["duplicates"] and not phase.get("setup_overran_ms")
        for phase in results.values()
    )


def report(cfg: Config, rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    ratios = [_ratio(results) for results in rounds]
    # The pair whose ratio is the median (the higher of the middle two) of
    # the whole pairs, or of all when none is.
    whole = [i for i, results in enumerate(rounds) if _whole(results)] or list(range(len(rounds)))
    ranked = sorted(whole, key=lambda i: ratios[i] or 0.0)
    middle = ranked[len(ranked) // 2]
    off, on = rounds[middle]["off"], rounds[middle]["on"]
    return {
        "offered_per_s": cfg.rate,
        "cpu_s_per_1k_off": off["cpu_s_per_1k"],
        "cpu_s_per_1k_on": on["cpu_s_per_1k"],
        "cpu_ratio_traced": ratios[middle],
        "cpu_ratio_traced_rounds": ratios,
        "rounds_whole": [_whole(results) for results in rounds],
        "lag_p99_ms_off": off["lag_p99_ms"],
        "lag_p99_ms_on": on["lag_p99_ms"],
        "lost": sum(phase["lost"] for results in rounds for phase in results.values()),
        "duplicates": sum(phase["duplicates"] for results in rounds for phase in results.values()),
        "cpu_counts": (
            "utime+stime of the node (wheelctl serve) and the worker (wheelctl worker) over the"
            " measured window, per 1,000 fires delivered"
        ),
        "phases": (
            "off, then on (OTEL_TRACES_EXPORTER=null in the node's and the worker's environment),"
            " each on a fresh node with one worker and the same one-shot no-op jobs; with"
            " --rounds, pairs in the order off on, on off...: the median pair's"
        ),
        "duration_s": cfg.duration_s,
        "off": off,
        "on": on,
    }


if __name__ == "__main__":
    sys.exit(main())
