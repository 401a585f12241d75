"""The benchmarks' own arithmetic, on made-up numbers: how the harness counts
lost and repeated fires, how ``--find-max`` picks its next rate, and where
plots go. Beside the benchmarks, not under ``tests``: the tests run the
benchmarks as programs and never import them."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import _equal_latency as eq
import _harness as h
import _results_page as page_
import dispatch
import numpy as np
import runs

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


def test_the_next_poll_interval_aims_at_wheels_p99_from_the_runs_either_side() -> None:
    def run(interval: int, p99: float) -> dict[str, Any]:
        return {"poll_interval_ms": interval, "lag_p99_ms": p99}

    # Straddled: between 25 ms (p99 30) and 100 ms (p99 130), a p99 of 40
    # lies a tenth of the way.
    assert eq.next_poll_interval(40, [run(25, 30), run(100, 130)]) == 32
    # Every interval too slow: shorten the shortest by what it is over, at
    # most by half.
    assert eq.next_poll_interval(40, [run(100, 130), run(500, 540)]) == 50
    assert eq.next_poll_interval(40, [run(30, 45), run(500, 540)]) == 25
    assert eq.next_poll_interval(40, [run(8, 60)]) == 5  # never below 5 ms
    # Every interval too quick: lengthen the longest by what it is under, at
    # most doubling it.
    assert eq.next_poll_interval(40, [run(20, 32)]) == 28
    assert eq.next_poll_interval(40, [run(5, 12)]) == 10
    # One within 10% already, or the guess was run: nothing more to try.
    assert eq.next_poll_interval(40, [run(25, 43), run(500, 540)]) is None
    # Never below 5 ms (a poller at 1 ms takes the machine).
    assert eq.next_poll_interval(40, [run(100, 130), run(5, 60)]) is None
    assert eq.next_poll_interval(40, []) is None


def test_the_equal_latency_ratio_takes_the_poll_run_nearest_wheels_p99() -> None:
    def run(system: str, p99: float, cpu: float, db: float, **kw: int) -> dict[str, Any]:
        return {"system": system, "store": "postgres", "lag_p99_ms": p99,
                "cpu_s_per_1k": cpu, "db_cpu_s_per_1k": db, **kw}  # fmt: skip

    runs = [
        run("wheel", 40, 0.1, 0.1, tick_ms=30),
        run("wheel", 280, 0.05, 0.05, tick_ms=250),
        run("poll", 35, 0.2, 0.2, poll_interval_ms=25),
        run("poll", 150, 0.1, 0.2, poll_interval_ms=100),
    ]
    fig = eq.figure(runs, "postgres", 30)
    assert fig is not None
    assert (fig["poll_interval_ms"], fig["within_10pct"]) == (25, False)  # 35 is 12.5% off
    assert fig["cpu_ratio"] == 0.5  # 0.2 over 0.4, the database's CPU included
    assert fig["target"] == 0.5
    assert eq.figure(runs, "sqlite", 30) is None  # nothing ran there


def test_the_equal_latency_section_is_replaced_and_the_rest_of_the_page_kept(
    tmp_path: Path,
) -> None:
    page = tmp_path / "RESULTS.md"
    side = [{"system": "wheel", "store": "sqlite", "rate": 2000.0, "lag_p99_ms": 35.0}]
    page_.write_results(page, ["--rate", "2000"], side, [], [])
    main = page.read_text()
    runs = [
        {"system": "wheel", "store": "sqlite", "tick_ms": 30, "lag_p50_ms": 20.0,
         "lag_p99_ms": 35.0, "cpu_s_per_1k": 0.1, "db_cpu_s_per_1k": 0.0},
        {"system": "poll", "store": "sqlite", "poll_interval_ms": 25, "lag_p50_ms": 15.0,
         "lag_p99_ms": 37.0, "cpu_s_per_1k": 0.2, "db_cpu_s_per_1k": 0.0, "matched": True},
    ]  # fmt: skip
    fig = eq.figure(runs, "sqlite", 30)
    assert fig is not None
    page_.write_equal_latency(page, ["--equal-latency", "--tick-ms", "30"], runs, {"sqlite": fig})
    first = page.read_text()
    assert first.startswith(main.rstrip("\n"))
    assert "dispatch.py --equal-latency --tick-ms 30" in first
    assert "| sqlite | poll | interval 25 ms (matched) |" in first
    assert "`equal_latency_cpu_ratio` 0.50 (target <= 0.7: met)" in first
    # Again: the section replaced, not added; the main part written again
    # keeps it.
    page_.write_equal_latency(page, ["--equal-latency", "--tick-ms", "30,250"], runs, {})
    assert page.read_text().count(page_.SECTION_BEGIN) == 1
    assert "--tick-ms 30,250" in page.read_text()
    page_.write_results(page, ["--rate", "1000"], side, [], [])
    again = page.read_text()
    assert "--rate 1000" in again and "--tick-ms 30,250" in again
    assert again.count(page_.SECTION_END) == 1


def test_a_burst_is_every_one_shot_due_at_the_same_instant() -> None:
    w = h.Workload.burst(count=5, at_ms=1_000)
    job, sched = w.fires()
    assert sorted(job.tolist()) == [1, 2, 3, 4, 5]
    assert set(sched.tolist()) == {1_000}
    assert (w.start_ms, w.end_ms) == (1_000, 1_001)


def test_the_stall_during_retention_is_the_new_maximum_or_the_top_of_the_buckets_it_grew() -> None:
    def scrape(top: float, buckets: dict[str, float]) -> dict[str, float]:
        out = {"wheel_loop_stall_max_seconds": top}
        for le, n in buckets.items():
            out[f"wheel_loop_stall_seconds_bucket{{le={le}}}"] = n
        return out

    before = scrape(0.3, {"0.01": 5, "0.05": 8, "0.1": 9, "0.5": 10, "+Inf": 10})
    # The maximum rose during the pass: that is the pass's.
    assert runs.stalled_during(before, scrape(0.42, {"0.5": 11, "+Inf": 11})) == (0.42, "max")
    # It did not: the pass's stalls all lie under the first bound that grew
    # by as many as +Inf did (two stalls, both at or under 50 ms).
    grown = scrape(0.3, {"0.01": 6, "0.05": 10, "0.1": 11, "0.5": 12, "+Inf": 12})
    assert runs.stalled_during(before, grown) == (0.05, "bucket")
    assert runs.stalled_during(before, before) == (0.0, "none")
