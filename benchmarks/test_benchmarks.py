"""The benchmarks' own arithmetic, on made-up numbers: how the harness counts
lost and repeated fires, how ``--find-max`` picks its next rate, and where
plots go. Beside the benchmarks, not under ``tests``: the tests run the
benchmarks as programs and never import them."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import _harness as h
import dispatch
import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def test_lost_fires_count_with_censored_lag_and_repeats_count_as_duplicates() -> None:
    w = h.Workload.build(rate=10, duration_s=2, start_ms=1_000, recurring_fraction=0.5, period_s=1)
    job, sched = w.fires()
    assert len(job) == 20  # rate x duration fires come due, one-shot and recurring mixed
    rec = np.zeros(len(job), h.RECORD_DTYPE)
    rec["job"], rec["sched"] = job, sched
    rec["recv"], rec["done"] = sched + 5, sched + 6
    # Fire 0 never arrives; fire 1 arrives and completes twice.
    records = np.concatenate([rec[1:], rec[1:2]])
    a = h.analyse(w, records, job_index=None, end_ms=10_000)
    assert (a.lost, a.duplicates, a.dispatched) == (1, 1, 19)
    # The lost fire is not dropped from the lag distribution: it counts as late
    # as the run's end, so it dominates the tail.
    assert a.lag_ms.max() == 10_000 - sched[0]
    assert sorted(a.lag_ms)[:19] == [5.0] * 19


def test_find_max_bisects_the_100_ms_bar_between_the_steps_either_side_of_it() -> None:
    def st(rate: float, p99: float, ok: bool = True) -> dict[str, Any]:
        return {"rate": rate, "lag_p99_ms": p99, "ok": ok}

    doubled = [st(8000, 29), st(16000, 37), st(32000, 815), st(64000, 9592, ok=False)]
    assert dispatch.next_tight_rate(doubled) == 22627  # between 16,000 and 32,000
    narrowed = [*doubled, st(22627, 80), st(26908, 640), st(24675, 99)]
    assert dispatch.next_tight_rate(narrowed) is None  # 24,675 and 26,908: within 15%
    assert dispatch.next_tight_rate([st(1000, 500), st(2000, 600)]) is None  # never met
    assert dispatch.next_tight_rate([st(1000, 20), st(2000, 40)]) is None  # nothing above


def test_plots_go_beside_the_results_page_or_out_of_the_tracked_tree(tmp_path: Path) -> None:
    page = ROOT / "benchmarks" / "RESULTS.md"
    assert dispatch.plots_dir(page, None) == ROOT / "benchmarks" / "plots"
    # A one-off run writes where git ignores it.
    one_off = dispatch.plots_dir(None, None)
    assert one_off == ROOT / "benchmarks" / "out" / "plots"
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", str(one_off / "lag.png")], cwd=ROOT, check=False
    )
    assert ignored.returncode == 0
    assert dispatch.plots_dir(page, tmp_path) == tmp_path
