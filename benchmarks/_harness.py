"""Shared machinery of the dispatch benchmark: the workload, the dispatch queue
(a loopback TCP transport), the per-run records workers write, CPU accounting
from /proc, lag statistics without coordinated omission, progress and plots.

Every system under test is driven the same way: jobs are submitted before the
measured window, worker processes append one fixed-size record per received
run to their own file, and the harness computes every figure from those files
and from the intended fire times of the workload — never from what the
scheduler says it did.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SLO_P99_MS = 1000.0  # the seed's dispatch SLO: p99 lag <= 1 s

# --------------------------------------------------------------------------- workload


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadJob:
    """One job to submit: a one-shot at ``first_ms`` or an interval job from ``first_ms``."""

    index: int  # 1-based; the job id for the baselines, mapped to the server's id for wheel
    first_ms: int
    period_ms: int  # 0: one-shot


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """Jobs whose fires come due at ``rate`` per second over [start_ms, end_ms)."""

    rate: float
    start_ms: int
    end_ms: int
    period_ms: int
    jobs: tuple[WorkloadJob, ...]

    @staticmethod
    def build(
        *, rate: float, duration_s: float, start_ms: int, recurring_fraction: float, period_s: float
    ) -> Workload:
        """A mix: ``recurring_fraction`` of the fires from interval jobs (period P,
        R*P*fraction jobs with evenly staggered phases), the rest from one-shots
        spread evenly over the window."""
        duration_ms = round(duration_s * 1000)
        period_ms = max(1, round(period_s * 1000))
        n_interval = round(rate * period_s * recurring_fraction)
        jobs: list[WorkloadJob] = []
        for i in range(n_interval):
            first = start_ms + (i * period_ms) // n_interval
            jobs.append(WorkloadJob(index=len(jobs) + 1, first_ms=first, period_ms=period_ms))
        once_rate = rate - n_interval * 1000.0 / period_ms
        n_once = max(0, round(once_rate * duration_s))
        for i in range(n_once):
            at = start_ms + (i * duration_ms) // n_once
            jobs.append(WorkloadJob(index=len(jobs) + 1, first_ms=at, period_ms=0))
        return Workload(
            rate=rate,
            start_ms=start_ms,
            end_ms=start_ms + duration_ms,
            period_ms=period_ms,
            jobs=tuple(jobs),
        )

    @staticmethod
    def burst(*, count: int, at_ms: int) -> Workload:
        """``count`` one-shots all due at ``at_ms``; the window is that one
        millisecond (its rate: the count over a second)."""
        jobs = tuple(WorkloadJob(index=i + 1, first_ms=at_ms, period_ms=0) for i in range(count))
        return Workload(rate=float(count), start_ms=at_ms, end_ms=at_ms + 1, period_ms=0, jobs=jobs)

    def fires(self) -> tuple[np.ndarray, np.ndarray]:
        """(job index, scheduled ms) of every fire due inside the window."""
        idx: list[np.ndarray] = []
        ms: list[np.ndarray] = []
        once = [j for j in self.jobs if j.period_ms == 0]
        if once:
            idx.append(np.fromiter((j.index for j in once), np.int64, len(once)))
            ms.append(np.fromiter((j.first_ms for j in once), np.int64, len(once)))
        for j in self.jobs:
            if j.period_ms:
                times = np.arange(j.first_ms, self.end_ms, j.period_ms, dtype=np.int64)
                idx.append(np.full(len(times), j.index, np.int64))
                ms.append(times)
        if not idx:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        return np.concatenate(idx), np.concatenate(ms)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# --------------------------------------------------------------------------- records

# What a worker writes per received run: job id (the system's), scheduled_for ms,
# received wall ms, completed wall ms (0 if the handler never finished).
RECORD = struct.Struct("<qqqq")
RECORD_DTYPE = np.dtype([("job", "<i8"), ("sched", "<i8"), ("recv", "<i8"), ("done", "<i8")])


class RecordWriter:
    """Buffers records in memory and appends them to the worker's own file at
    most every ``flush_s``, so the harness can follow progress without a pipe."""

    def __init__(self, path: Path, flush_s: float = 0.2) -> None:
        self._f = open(path, "ab")  # noqa: SIM115 - kept open for the worker's life
        self._buf = bytearray()
        self._flush_s = flush_s
        self._last = time.monotonic()

    def add(self, job: int, sched_ms: int, recv_ms: int, done_ms: int) -> None:
        self._buf += RECORD.pack(job, sched_ms, recv_ms, done_ms)

    def maybe_flush(self) -> None:
        if self._buf and time.monotonic() - self._last >= self._flush_s:
            self.flush()

    def flush(self) -> None:
        self._last = time.monotonic()
        if self._buf:
            self._f.write(self._buf)
            self._f.flush()
            self._buf.clear()

    def close(self) -> None:
        self.flush()
        self._f.close()


class RecordReader:
    """Follows the workers' record files, returning only whole new records."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self._paths = list(paths)
        self._offsets = [0] * len(self._paths)
        self._chunks: list[np.ndarray] = []

    def poll(self) -> np.ndarray:
        new: list[np.ndarray] = []
        for i, p in enumerate(self._paths):
            try:
                with open(p, "rb") as f:
                    f.seek(self._offsets[i])
                    data = f.read()
            except FileNotFoundError:
                continue
            whole = len(data) - len(data) % RECORD.size
            if whole:
                self._offsets[i] += whole
                new.append(np.frombuffer(data[:whole], RECORD_DTYPE).copy())
        arr = np.concatenate(new) if new else np.empty(0, RECORD_DTYPE)
        if len(arr):
            self._chunks.append(arr)
        return arr

    def all(self) -> np.ndarray:
        return np.concatenate(self._chunks) if self._chunks else np.empty(0, RECORD_DTYPE)


# --------------------------------------------------------------------------- dispatch queue

# One frame = a u32 count then that many runs (run_id, job_id, scheduled ms, fence).
RUN = struct.Struct("<qqqq")
COUNT = struct.Struct("<I")


def encode_runs(runs: Sequence[tuple[int, int, int, int]]) -> bytes:
    return COUNT.pack(len(runs)) + b"".join(RUN.pack(*r) for r in runs)


class Dispatcher:
    """The seed's dispatch queue on loopback: one TCP connection per worker, runs
    handed out round-robin, one frame per worker per batch."""

    def __init__(self, workers: int, host: str = "127.0.0.1") -> None:
        self._listener = socket.create_server((host, 0))
        self.port: int = self._listener.getsockname()[1]
        self._workers = workers
        self._conns: list[socket.socket] = []
        self._next = 0

    def accept_all(self, timeout_s: float = 60.0) -> None:
        self._listener.settimeout(timeout_s)
        while len(self._conns) < self._workers:
            conn, _ = self._listener.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._conns.append(conn)
        self._listener.close()

    def send(self, runs: Sequence[tuple[int, int, int, int]]) -> None:
        if not runs:
            return
        k = len(self._conns)
        shares: list[list[tuple[int, int, int, int]]] = [[] for _ in range(k)]
        for i, r in enumerate(runs):
            shares[(self._next + i) % k].append(r)
        self._next = (self._next + len(runs)) % k
        for conn, share in zip(self._conns, shares, strict=True):
            if share:
                conn.sendall(encode_runs(share))

    def close(self) -> None:
        for c in self._conns:
            c.close()


def recv_frames(buf: bytearray) -> Iterator[list[tuple[int, int, int, int]]]:
    """Yields every complete frame in ``buf`` (consuming it)."""
    while len(buf) >= COUNT.size:
        (n,) = COUNT.unpack_from(buf)
        end = COUNT.size + n * RUN.size
        if len(buf) < end:
            return
        yield [RUN.unpack_from(buf, COUNT.size + i * RUN.size) for i in range(n)]
        del buf[:end]


# --------------------------------------------------------------------------- CPU


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process from /proc/PID/stat (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_total(pids: Sequence[int]) -> dict[int, float]:
    return {p: cpu_seconds(p) for p in pids}


# --------------------------------------------------------------------------- analysis


@dataclass(slots=True, kw_only=True)
class Analysis:
    """Every figure of one run, computed from the workload and the records."""

    expected: int
    dispatched: int
    completed: int
    lost: int
    duplicates: int
    dispatched_per_s: float
    completed_per_s: float
    lag_ms: np.ndarray  # one per expected fire; censored at the end for lost ones
    recv_times_ms: np.ndarray  # first receipt of each dispatched fire
    extra: dict[str, float] = field(default_factory=dict)


def fire_keys(job: np.ndarray, sched: np.ndarray, start_ms: int) -> np.ndarray:
    """One int64 per fire: the job index in the high bits, the offset in the low 32."""
    return (job.astype(np.int64) << 32) | ((sched - start_ms + (1 << 31)) & 0xFFFFFFFF)


def analyse(
    workload: Workload,
    records: np.ndarray,
    *,
    job_index: dict[int, int] | None,
    end_ms: int,
) -> Analysis:
    """Match records to the intended fires.

    Lag is measured for EVERY intended fire against its scheduled time: a fire
    never dispatched by ``end_ms`` (measured window + drain) counts as lost AND
    contributes the censored lag ``end_ms - scheduled`` (a lower bound of its
    true lag), so a system cannot improve its percentiles by dropping work.
    """
    exp_job, exp_ms = workload.fires()
    exp_keys = fire_keys(exp_job, exp_ms, workload.start_ms)
    rec_job = records["job"]
    if job_index is not None and len(rec_job):
        lookup = np.vectorize(lambda j: job_index.get(int(j), 0), otypes=[np.int64])
        rec_job = lookup(rec_job)
    rec_keys = fire_keys(rec_job, records["sched"], workload.start_ms)

    # Duplicate effects: the same idempotency key completed more than once.
    # Counted on the system's own (job id, scheduled_for), before any id mapping.
    done = records["done"] > 0
    pairs = np.stack([records["job"][done], records["sched"][done]], axis=1)
    _, done_counts = np.unique(pairs, axis=0, return_counts=True)
    duplicates = int((done_counts - 1).sum()) if len(done_counts) else 0

    # First receipt and first completion per key.
    order = np.lexsort((records["recv"], rec_keys))
    sk = rec_keys[order]
    first = np.ones(len(sk), bool)
    first[1:] = sk[1:] != sk[:-1]
    uniq_keys = sk[first]
    first_recv = records["recv"][order][first]
    done_ms = np.where(records["done"] > 0, records["done"], np.iinfo(np.int64).max)
    order_d = np.lexsort((done_ms, rec_keys))
    first_done = done_ms[order_d][np.r_[True, rec_keys[order_d][1:] != rec_keys[order_d][:-1]]]

    pos = np.searchsorted(uniq_keys, exp_keys)
    pos_c = np.minimum(pos, max(len(uniq_keys) - 1, 0))
    hit = (
        (pos < len(uniq_keys)) & (uniq_keys[pos_c] == exp_keys)
        if len(uniq_keys)
        else (np.zeros(len(exp_keys), bool))
    )
    recv = np.where(hit, first_recv[pos_c] if len(uniq_keys) else 0, 0)
    hit &= recv <= end_ms
    dne = np.where(hit, first_done[pos_c] if len(uniq_keys) else 0, 0)
    completed_mask = hit & (dne <= end_ms)

    lag = np.where(hit, recv - exp_ms, end_ms - exp_ms).astype(np.float64)
    dispatched = int(hit.sum())
    completed = int(completed_mask.sum())
    span_s = workload_span_s(workload)
    # Sustained rate: dispatches over the time they took (first to last receipt), never
    # shorter than the window: a constant lag does not count against a system, a
    # growing backlog does.
    recv_hit = recv[hit]
    done_hit = dne[completed_mask]
    disp_span = max(span_s, _span_s(recv_hit))
    done_span = max(span_s, _span_s(done_hit))
    return Analysis(
        expected=len(exp_keys),
        dispatched=dispatched,
        completed=completed,
        lost=len(exp_keys) - dispatched,
        duplicates=duplicates,
        dispatched_per_s=dispatched / disp_span,
        completed_per_s=completed / done_span,
        lag_ms=lag,
        recv_times_ms=np.sort(recv_hit),
    )


def _span_s(times_ms: np.ndarray) -> float:
    return (int(times_ms.max()) - int(times_ms.min())) / 1000 if len(times_ms) else 0.0


def workload_span_s(workload: Workload) -> float:
    return (workload.end_ms - workload.start_ms) / 1000


def pct(values: np.ndarray, q: float) -> float:
    if not len(values):
        return 0.0
    return float(np.percentile(values, q, method="higher"))


# --------------------------------------------------------------------------- progress


class Progress:
    """One updating line on stderr: rate, dispatched so far, lag p99 so far (with
    every due-but-undispatched fire counted at its current lateness)."""

    def __init__(self, label: str, workload: Workload, job_index: dict[int, int] | None) -> None:
        self._label = label
        self._w = workload
        self._job_index = job_index
        exp_job, exp_ms = workload.fires()
        order = np.argsort(exp_ms, kind="stable")
        self._exp_ms = exp_ms[order]
        self._exp_keys = fire_keys(exp_job[order], self._exp_ms, workload.start_ms)
        sorter = np.argsort(self._exp_keys)
        self._sorted_keys = self._exp_keys[sorter]
        self._sorter = sorter
        self._recv = np.zeros(len(self._exp_keys), np.int64)  # 0: not yet
        self.dispatched = 0
        self._tty = sys.stderr.isatty()
        self._last_print = 0.0

    def feed(self, new: np.ndarray) -> None:
        if not len(new):
            return
        job = new["job"]
        if self._job_index is not None:
            job = np.fromiter((self._job_index.get(int(j), 0) for j in job), np.int64, len(job))
        keys = fire_keys(job, new["sched"], self._w.start_ms)
        pos = np.searchsorted(self._sorted_keys, keys)
        pos_c = np.minimum(pos, max(len(self._sorted_keys) - 1, 0))
        ok = (pos < len(self._sorted_keys)) & (self._sorted_keys[pos_c] == keys)
        slots = self._sorter[pos_c[ok]]
        fresh = self._recv[slots] == 0
        self._recv[slots[fresh]] = new["recv"][ok][fresh]
        self.dispatched = int((self._recv > 0).sum())

    @property
    def all_dispatched(self) -> bool:
        return self.dispatched >= len(self._exp_keys)

    def p99_so_far(self, now: int) -> float:
        due = int(np.searchsorted(self._exp_ms, now, side="right"))
        if not due:
            return 0.0
        recv = self._recv[:due]
        lag = np.where(recv > 0, recv, now) - self._exp_ms[:due]
        return pct(lag.astype(np.float64), 99)

    def show(self, now: int, *, force: bool = False) -> None:
        t = time.monotonic()
        if not force and t - self._last_print < (0.25 if self._tty else 2.0):
            return
        self._last_print = t
        elapsed = (now - self._w.start_ms) / 1000
        line = (
            f"[{self._label}] t={elapsed:6.1f}s rate={self._w.rate:g}/s "
            f"dispatched={self.dispatched}/{len(self._exp_keys)} "
            f"lag_p99={self.p99_so_far(now) / 1000:.3f}s"
        )
        if self._tty:
            sys.stderr.write("\r" + line.ljust(100))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def done(self) -> None:
        if self._tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


# --------------------------------------------------------------------------- plots


def plot_results(
    runs: Sequence[tuple[str, Workload, Analysis]], out_dir: Path, tag: str
) -> list[Path]:
    """Throughput over time and lag CDF, each system side by side; returns the PNGs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []

    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 3.6), squeeze=False, sharey=True)
    for ax, (name, w, a) in zip(axes[0], runs, strict=True):
        t = (a.recv_times_ms - w.start_ms) / 1000
        horizon = max(workload_span_s(w), float(t.max()) if len(t) else 0.0)
        bins = np.arange(min(0.0, float(t.min()) if len(t) else 0.0), horizon + 1, 1.0)
        counts, edges = np.histogram(t, bins=bins)
        ax.step(edges[:-1], counts, where="post", label="dispatched/s")
        ax.axhline(w.rate, color="grey", linestyle="--", label=f"offered {w.rate:g}/s")
        ax.set_title(name)
        ax.set_xlabel("seconds since first fire")
        ax.legend(loc="lower center", fontsize=8)
    axes[0][0].set_ylabel("dispatches per second")
    fig.suptitle(f"Throughput over time ({tag})")
    fig.tight_layout()
    p = out_dir / f"throughput_{tag}.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    paths.append(p)

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, _, a in runs:
        lag = np.sort(np.maximum(a.lag_ms, 0.5))
        if len(lag):
            y = np.arange(1, len(lag) + 1) / len(lag)
            ax.plot(lag, y, label=name)
    ax.set_xscale("log")
    ax.axvline(SLO_P99_MS, color="grey", linestyle="--", label="1 s SLO")
    ax.axhline(0.99, color="lightgrey", linestyle=":")
    ax.set_xlabel("dispatch lag (ms, log; lost fires censored at run end)")
    ax.set_ylabel("fraction of intended fires")
    ax.set_title(f"Dispatch lag CDF ({tag})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = out_dir / f"lag_cdf_{tag}.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    paths.append(p)
    return paths


def fmt_num(x: float) -> str:
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return "-"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}"
