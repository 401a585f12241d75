"""HTTP targets benchmark: signed requests from one node and one ``wheelctl
worker --http`` process to a local receiver that verifies every signature,
beside a Python no-op handler through the same node setup, in one run.

    python benchmarks/http_targets.py --rate 2000 --duration 20 --json out.json
    python benchmarks/http_targets.py --smoke --json out.json

Two phases, one after the other, each on a fresh node (``wheelctl serve`` on
SQLite in a temp dir, the same flags) with one worker process (``wheelctl
worker``, the same capacity) and the same workload: one-shot jobs, submitted
before the measured window (bulk SubmitJobs), that come due at ``--rate`` per
second over ``--duration`` seconds.

- ``http``: each job has an HTTP target signed with a secret the node made
  (``SetSecret``, generated), run by ``wheelctl worker --http
  --allow-private-targets``. The receiver is a process of its own
  (``testkit/webhook_receiver.py``), keep-alive, answering 200; it verifies
  each request with the ``standardwebhooks`` library and keeps the time it
  arrived, its ``Wheel-Scheduled-For`` and its ``webhook-id``. It serves
  with a lean HTTP/1.1 protocol of its own: aiohttp's server (``--receiver
  aiohttp``) cost twice the CPU a request and was the run's bottleneck on
  two cores, so its lag was measured instead of wheel's.
- ``noop``: the same jobs with a Python handler that does nothing
  (``_noop_handler.py``) instead of the target, and the same body as payload.

Lag is a fire's arrival (at the receiver; at the handler for ``noop``) minus
its scheduled time, over every fire: one not delivered by the end of the
window plus ``--drain`` is ``lost`` and enters the percentiles at its
censored lag (see ``_harness.analyse``). CPU is utime + stime of the node
and the worker process from /proc over the measured window (from the first
fire's time until every fire arrived, plus 0.6 s for the completions that
follow), per 1,000 fires delivered; the receiver's own CPU is reported
apart and is in neither phase's figure. ``cpu_ratio_vs_noop`` is the http
phase's over the noop phase's.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _harness as h
import _report
from _drivers import WheelDriver, bench_spec, submit_workload

from testkit.procs import WHEEL_ROOT, ServerProc, WorkerProc, wait_for
from testkit.webhook_receiver import fetch_tally
from wheel.rpc.v1 import jobs_pb2

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SECRET_NAME = "bench-signing"
HOOK_PATH = "/hook"
PHASES = ("http", "noop")
CPU_COUNTS = (
    "utime+stime from /proc/PID/stat of the node (wheelctl serve) and the worker (wheelctl"
    " worker) processes over the measured window, per 1,000 fires delivered; the receiver's"
    " CPU is apart (receiver_cpu_s_per_1k) and in no ratio"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    rate: float
    duration_s: float
    drain_s: float
    capacity: int
    body_bytes: int
    http_timeout_ms: int
    serve_args: tuple[str, ...]
    store: str  # "default" (wheel's own) | "normal" (SQLite synchronous=NORMAL)
    receiver: str  # the receiver's server: "lean" | "aiohttp"
    # More environment for the node and the worker (benchmarks/tracing.py's OTEL_*).
    env: tuple[tuple[str, str], ...] = ()


@dataclass(slots=True, kw_only=True)
class Phase:
    """One phase's processes and where its evidence is."""

    name: str
    tmp: Path
    node: ServerProc
    worker: WorkerProc | None = None
    receiver: subprocess.Popen[str] | None = None
    receiver_port: int = 0
    records: Path | None = None

    def pids(self) -> list[int]:
        assert self.node.proc is not None and self.worker is not None
        return [self.node.proc.pid, self.worker.proc.pid]

    def stop(self) -> None:
        # The worker first (it drains and its records flush), then the node.
        if self.worker is not None:
            self.worker.stop()
        self.node.stop()
        if self.receiver is not None and self.receiver.poll() is None:
            self.receiver.terminate()
            try:
                self.receiver.wait(10)
            except subprocess.TimeoutExpired:
                self.receiver.kill()
                self.receiver.wait()
        if self.receiver is not None and self.receiver.stdout is not None:
            self.receiver.stdout.close()


def body_of(j: h.WorkloadJob, size: int) -> bytes:
    """A JSON body naming its fire (the receiver tells fires apart by it),
    padded to about ``size`` bytes like a small webhook's."""
    head = f'{{"fire": {j.index}, "event": "scheduled", "pad": "'
    pad = max(0, size - len(head) - 2)
    return (head + "x" * pad + '"}').encode()


def http_spec(url: str, cfg: Config) -> Callable[[h.WorkloadJob], Any]:
    """A workload job as a signed HTTP target with its body."""

    def spec_of(j: h.WorkloadJob) -> Any:
        spec = bench_spec(j)
        spec.name = f"http-bench-{j.index}"
        spec.handler = ""
        spec.payload = body_of(j, cfg.body_bytes)
        spec.http.CopyFrom(
            jobs_pb2.HttpTarget(
                url=url,
                method="POST",
                headers=[jobs_pb2.HttpHeader(name="Content-Type", value="application/json")],
                timeout_ms=cfg.http_timeout_ms,
                signing_secret=SECRET_NAME,
            )
        )
        return spec

    return spec_of


def noop_spec(cfg: Config) -> Callable[[h.WorkloadJob], Any]:
    """A workload job as a run of the Python no-op handler, the same body as payload."""

    def spec_of(j: h.WorkloadJob) -> Any:
        spec = bench_spec(j)
        spec.name = f"noop-bench-{j.index}"
        spec.handler = "noop"
        spec.payload = body_of(j, cfg.body_bytes)
        return spec

    return spec_of


def make_secret(target: str) -> str:
    """A new signing secret on the node (generated there); its whsec_ value."""
    import grpc

    from wheel.rpc.v1 import admin_service_pb2, admin_service_pb2_grpc

    with grpc.insecure_channel(target) as ch:
        stub = admin_service_pb2_grpc.AdminServiceStub(ch)
        resp = stub.SetSecret(
            admin_service_pb2.SetSecretRequest(name=SECRET_NAME, generate=True), timeout=30
        )
    value = str(resp.value)
    if not value.startswith("whsec_"):
        raise RuntimeError("SetSecret(generate) answered no whsec_ value")
    return value


def start_node(tmp: Path, cfg: Config) -> ServerProc:
    data = tmp / "data"
    data.mkdir(parents=True)
    store = f"sqlite:///{data / 'wheel.db'}?synchronous=normal" if cfg.store == "normal" else None
    env = {**os.environ, **dict(cfg.env)} if cfg.env else None
    node = ServerProc(data, store=store, args=cfg.serve_args, env=env)
    node.start()
    return node


def start_receiver(tmp: Path, secret: str, server: str) -> tuple[subprocess.Popen[str], int]:
    secret_file = tmp / "receiver.secret"
    secret_file.touch(mode=0o600)
    secret_file.write_text(secret)
    cmd = [sys.executable, "-m", "testkit.webhook_receiver", "--secret-file", str(secret_file)]
    with open(tmp / "receiver.log", "wb") as log:
        proc = subprocess.Popen(
            [*cmd, "--server", server], cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True
        )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"the receiver did not start; see {tmp / 'receiver.log'}")
    return proc, int(line.split()[1])


def prepare(name: str, cfg: Config, root: Path) -> Phase:
    """A node, the receiver (http) and a connected worker."""
    tmp = root / name
    tmp.mkdir()
    phase = Phase(name=name, tmp=tmp, node=start_node(tmp, cfg))
    try:
        capacity = ("--capacity", str(cfg.capacity))
        if name == "http":
            secret = make_secret(phase.node.target)
            phase.receiver, phase.receiver_port = start_receiver(tmp, secret, cfg.receiver)
            phase.worker = WorkerProc(
                phase.node.target,
                tmp / "out",
                "http-bench",
                flags=("--http", "--allow-private-targets", *capacity),
                env=dict(cfg.env),
            )
        else:
            phase.records = tmp / "noop.rec"
            phase.worker = WorkerProc(
                phase.node.target,
                tmp / "out",
                "noop-bench",
                "_noop_handler:noop",
                flags=capacity,
                env={
                    "WHEEL_BENCH_RECORDS": str(phase.records),
                    # The handler's folder, and the wheel this benchmark runs.
                    "PYTHONPATH": os.pathsep.join((str(HERE), str(WHEEL_ROOT))),
                    **dict(cfg.env),
                },
                cwd=HERE,
            )
        wait_for(phase.worker.connected, 30, f"the {name} worker to connect")
    except BaseException:
        phase.stop()
        raise
    return phase


class HttpEvidence:
    """The receiver's tally, as records the harness reads: (fire, scheduled
    ms, received ms, received ms)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.summary: dict[str, Any] = {}

    def delivered(self) -> int:
        return int(fetch_tally(self.port)["unique_ids"])

    def records(self) -> np.ndarray:
        self.summary = fetch_tally(self.port, records=True)
        rows = self.summary.pop("records")
        out = np.zeros(len(rows), h.RECORD_DTYPE)
        if rows:
            arr = np.asarray(rows, np.int64)
            out["job"], out["sched"], out["recv"], out["done"] = (
                arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 2],
            )  # fmt: skip
        return out


class NoopEvidence:
    """The no-op handler's record file."""

    def __init__(self, path: Path) -> None:
        self.reader = h.RecordReader([path])
        self.count = 0

    def delivered(self) -> int:
        self.count += len(self.reader.poll())
        return self.count

    def records(self) -> np.ndarray:
        self.reader.poll()
        return self.reader.all()


def lead_ms(jobs: int) -> int:
    """How far ahead the first fire lies: room for the submission (at the
    dispatch benchmark's rate for wheel) and the start of the window."""
    return 3000 + round(1500 * jobs / WheelDriver.submit_rate_hint)


def run_phase(name: str, cfg: Config, root: Path) -> dict[str, Any]:
    phase = prepare(name, cfg, root)
    try:
        probe = h.Workload.build(
            rate=cfg.rate, duration_s=cfg.duration_s, start_ms=0, recurring_fraction=0.0,
            period_s=1.0,
        )  # fmt: skip
        start_ms = h.now_ms() + lead_ms(len(probe.jobs))
        workload = h.Workload.build(
            rate=cfg.rate, duration_s=cfg.duration_s, start_ms=start_ms, recurring_fraction=0.0,
            period_s=1.0,
        )  # fmt: skip
        evidence: HttpEvidence | NoopEvidence
        if name == "http":
            spec_of = http_spec(f"http://127.0.0.1:{phase.receiver_port}{HOOK_PATH}", cfg)
            evidence = HttpEvidence(phase.receiver_port)
        else:
            assert phase.records is not None
            spec_of = noop_spec(cfg)
            evidence = NoopEvidence(phase.records)
        t0 = time.monotonic()
        job_index = submit_workload(phase.node.target, workload, spec_of)
        submitted_per_s = len(workload.jobs) / max(1e-9, time.monotonic() - t0)
        overran = max(0, h.now_ms() - (workload.start_ms - 200))
        if overran:
            print(f"warning: [{name}] submission ran {overran} ms into the window", file=sys.stderr)
        time.sleep(max(0.0, (workload.start_ms - h.now_ms()) / 1000))
        pids = phase.pids()
        receiver_pid = phase.receiver.pid if phase.receiver is not None else None
        cpu0 = h.cpu_total([*pids, *([receiver_pid] if receiver_pid else [])])
        expected = len(workload.jobs)
        hard_end = workload.end_ms + round(cfg.drain_s * 1000)
        all_at: int | None = None
        last_print = 0.0
        while True:
            time.sleep(0.25)
            now = h.now_ms()
            delivered = evidence.delivered()
            if time.monotonic() - last_print >= 2:
                last_print = time.monotonic()
                print(
                    f"[{name}] t={(now - workload.start_ms) / 1000:6.1f}s"
                    f" delivered={delivered}/{expected}",
                    file=sys.stderr,
                )
            if delivered >= expected and now >= workload.end_ms:
                all_at = all_at or now
                if now - all_at >= 600:  # the completions that follow the last fires
                    break
            if now >= hard_end:
                break
            for proc in (phase.node.proc, phase.worker.proc if phase.worker else None):
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"a {name} process exited during the run; see {phase.tmp}")
        end_ms = h.now_ms()
        cpu1 = h.cpu_total(list(cpu0))
        worker_rss_mb = peak_rss_mb(pids[1])
        records = evidence.records()
    finally:
        phase.stop()
    if isinstance(evidence, NoopEvidence):
        records = evidence.records()  # what the worker flushed as it stopped
    if os.environ.get("WHEEL_BENCH_KEEP"):
        # Every arrival (fire, scheduled, received, received), to look into a tail.
        np.save(phase.tmp / "records.npy", records)
    a = h.analyse(workload, records, job_index=job_index if name == "noop" else None, end_ms=end_ms)
    per_k = 1000 / a.dispatched if a.dispatched else float("nan")
    node_cpu = cpu1[pids[0]] - cpu0[pids[0]]
    worker_cpu = cpu1[pids[1]] - cpu0[pids[1]]
    result: dict[str, Any] = {
        "expected_fires": expected,
        "delivered": a.dispatched,
        "delivered_per_s": round(a.dispatched_per_s, 1),
        "lag_p50_ms": h.pct(a.lag_ms, 50),
        "lag_p99_ms": h.pct(a.lag_ms, 99),
        "lag_p999_ms": h.pct(a.lag_ms, 99.9),
        "lag_max_ms": float(a.lag_ms.max()) if len(a.lag_ms) else 0.0,
        "lost": a.lost,
        "duplicates": a.duplicates,
        "cpu_s_per_1k": round((node_cpu + worker_cpu) * per_k, 4),
        "node_cpu_s_per_1k": round(node_cpu * per_k, 4),
        "worker_cpu_s_per_1k": round(worker_cpu * per_k, 4),
        "worker_peak_rss_mb": worker_rss_mb,
        "window_s": round((end_ms - workload.start_ms) / 1000, 2),
        "submitted_per_s": round(submitted_per_s),
        "setup_overran_ms": overran,
    }
    if isinstance(evidence, HttpEvidence):
        tally = evidence.summary
        assert receiver_pid is not None
        result["receiver_cpu_s_per_1k"] = round(
            (cpu1[receiver_pid] - cpu0[receiver_pid]) * per_k, 4
        )
        result["requests"] = tally["requests"]
        result["bad_signatures"] = tally["bad_signatures"]
        # By webhook-id: a fire's second request, signed or not.
        result["duplicates"] = tally["duplicates"]
        result["connections"] = tally["connections"]
        if tally["errors"]:
            result["signature_errors"] = tally["errors"]
        result["scheduled_for_mismatches"] = scheduled_for_mismatches(workload, records)
    return result


def peak_rss_mb(pid: int) -> float:
    """The most memory the process held so far (VmHWM), in MiB; 0 if unknown."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return 0.0


def scheduled_for_mismatches(workload: h.Workload, records: np.ndarray) -> int:
    """Requests whose ``Wheel-Scheduled-For`` is not their fire's time."""
    at = {j.index: j.first_ms for j in workload.jobs}
    return sum(1 for r in records if at.get(int(r["job"])) != int(r["sched"]))


def main(argv: list[str] | None = None) -> int:
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop every child process.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rate", type=float, default=2000.0, help="fires per second coming due")
    p.add_argument("--duration", type=float, default=20.0, help="measured window, seconds")
    p.add_argument("--drain", type=float, default=5.0, help="seconds after the window")
    p.add_argument("--json", type=Path, help="write the result here")
    p.add_argument(
        "--smoke", action="store_true", help="a quick run: --rate 50 --duration 2 --drain 5"
    )
    p.add_argument(
        "--phases", default=",".join(PHASES), help="http,noop (both: the ratio needs both)"
    )
    p.add_argument(
        "--capacity", type=int, default=1000, help="runs in flight per worker, both phases"
    )
    p.add_argument("--body-bytes", type=int, default=256, help="each request's body (payload)")
    p.add_argument("--http-timeout", type=int, default=10_000, help="the targets' timeout, ms")
    p.add_argument(
        "--store",
        choices=["default", "normal"],
        default="default",
        help="SQLite at wheel's default durability, or synchronous=NORMAL (as dispatch.py's)",
    )
    p.add_argument("--serve-args", default="", help="extra flags for wheelctl serve (both)")
    p.add_argument(
        "--receiver",
        choices=["lean", "aiohttp"],
        default="lean",
        help="the receiver's HTTP server: lean (its own protocol, about half aiohttp's CPU a\n"
        "request: see testkit/webhook_receiver.py) or aiohttp's",
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.rate, args.duration, args.drain = 50.0, 2.0, 5.0
    phases = [s.strip() for s in args.phases.split(",") if s.strip()]
    if not phases or any(s not in PHASES for s in phases):
        p.error(f"--phases: some of {', '.join(PHASES)}")
    cfg = Config(
        rate=args.rate, duration_s=args.duration, drain_s=args.drain, capacity=args.capacity,
        body_bytes=args.body_bytes, http_timeout_ms=args.http_timeout,
        serve_args=tuple(shlex.split(args.serve_args)), store=args.store, receiver=args.receiver,
    )  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="wheel-bench-http-"))
    try:
        results = {name: run_phase(name, cfg, tmp) for name in phases}
    finally:
        # WHEEL_BENCH_KEEP=1 keeps the logs and stores (as dispatch.py does).
        if os.environ.get("WHEEL_BENCH_KEEP"):
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    _report.emit(report(cfg, results), args.json)
    return 0


def report(cfg: Config, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    http, noop = results.get("http"), results.get("noop")
    out: dict[str, Any] = {"offered_per_s": cfg.rate}
    if http is not None:
        for key in ("delivered_per_s", "lag_p99_ms", "bad_signatures", "duplicates", "lost"):
            out[key] = http[key]
        out["cpu_s_per_1k"] = http["cpu_s_per_1k"]
    if http is not None and noop is not None:
        ratio = http["cpu_s_per_1k"] / noop["cpu_s_per_1k"] if noop["cpu_s_per_1k"] else None
        out["cpu_ratio_vs_noop"] = None if ratio is None else round(ratio, 3)
    out["cpu_counts"] = CPU_COUNTS
    out["phases"] = (
        "one after the other, each on a fresh node (same flags) with one worker process (same"
        " capacity) and the same jobs, schedule and bodies; http: wheelctl worker --http"
        " --allow-private-targets to a receiver process verifying every signature, lag at its"
        " arrival; noop: wheelctl worker _noop_handler:noop, lag at the handler"
    )
    out["duration_s"] = cfg.duration_s
    out["capacity"] = cfg.capacity
    out["store"] = (
        "SQLite synchronous=NORMAL" if cfg.store == "normal" else "SQLite, wheel's default"
    )
    out["receiver"] = f"{cfg.receiver} HTTP/1.1 server, verifying with standardwebhooks"
    out.update(results)
    return out


if __name__ == "__main__":
    sys.exit(main())
