"""Real wheel processes for end-to-end tests and benchmarks: a node and workers on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

import wheel
from testkit.services import free_port
from wheel.tls import ChannelSecurity, make_channel

HERE = Path(__file__).resolve().parent
# Where this process's wheel comes from: a worker runs the same (a checkout's
# own sources, not the ones an editable install points at).
WHEEL_ROOT = Path(wheel.__file__).resolve().parents[1]


def handlers_path(folder: Path) -> str:
    """A worker process's PYTHONPATH: ``folder`` (its handler modules) first,
    then this process's wheel and path, so that a worker runs the same
    sources as the test and its nodes (a checkout's, not the ones an
    editable install points at)."""
    paths = (str(folder), str(WHEEL_ROOT), os.environ.get("PYTHONPATH", ""))
    return os.pathsep.join(p for p in paths if p)


def wheelctl(
    *args: str, check: bool = True, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wheel", *args],
        capture_output=True,
        text=True,
        check=check,
        timeout=timeout,
    )


def log_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a process's log (what it said last)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class ServerProc:
    """`wheelctl serve` in a subprocess, restartable on the same data dir and port."""

    def __init__(
        self,
        data_dir: Path,
        *,
        store: str | None = None,
        args: tuple[str, ...] = (),
        security: ChannelSecurity | None = None,
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``python``: the interpreter to run ``-m wheel`` with (another
        environment's, to run an installed package); ``env``: its whole
        environment (default: this process's)."""
        self.data_dir = data_dir
        self.python = python
        self.environ = env
        # How the test reaches it (the node's own TLS flags are in ``args``).
        self.security = security
        self.port = free_port()
        self.store = store
        # More `wheelctl serve` flags, given at every start.
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        """This life's log (stdout and stderr) of the process."""
        return self.data_dir.parent / f"server-{self.starts}.log"

    def start(self) -> None:
        args = ["serve", "--data-dir", str(self.data_dir), "--listen", self.target]
        if self.store:
            args += ["--store", self.store]
        args += self.args
        self.starts += 1
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [self.python, "-m", "wheel", *args], stderr=log, stdout=log, env=self.environ
            )
        wait_for(self.healthy, 30, "the node to serve")

    def healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            # The log's end in the failure itself: CI keeps only the last few
            # runs' temporary directories, and the reason goes with them.
            raise AssertionError(
                f"server exited with {self.proc.returncode}; see {self.data_dir.parent};"
                f" its log ends:\n{log_tail(self.log_path)}"
            )
        try:
            with make_channel(self.target, self.security) as ch:
                resp = health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(), timeout=1
                )
                return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)
        except grpc.RpcError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class WorkerProc:
    """`wheelctl worker` in a subprocess, its output in ``{worker_id}.log`` beside
    ``out``. ``handlers`` default to ``e2e_handlers:record``, unless ``flags``
    (more `wheelctl worker` flags) give ``--http``: the built-in HTTP executor
    needs no module. ``env``: more environment; ``cwd``: where it runs (a
    handler module there is found)."""

    def __init__(
        self,
        target: str,
        out: Path,
        worker_id: str,
        *handlers: str,
        flags: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        full_env = dict(
            os.environ,
            WHEEL_E2E_OUT=str(out),
            WHEEL_E2E_WORKER=worker_id,
            PYTHONPATH=handlers_path(HERE),
        )
        full_env.update(env or {})
        if not handlers and "--http" not in flags:
            handlers = ("e2e_handlers:record",)
        self.log_path = out.parent / f"{worker_id}.log"
        with open(self.log_path, "wb") as log:
            self.proc = self._spawn(target, worker_id, (*handlers, *flags), full_env, log, cwd)

    @staticmethod
    def _spawn(
        target: str,
        worker_id: str,
        args: tuple[str, ...],
        env: dict[str, str],
        log: Any,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "wheel", "worker", "--target", target]
        return subprocess.Popen(
            [*cmd, "--worker-id", worker_id, *args],
            env=env,
            stderr=log,
            stdout=log,
            cwd=cwd,
        )

    def connected(self) -> bool:
        """Whether its log says it holds a stream to a node (it exited: an error)."""
        if self.proc.poll() is not None:
            raise AssertionError(f"worker exited with {self.proc.returncode}; see {self.log_path}")
        return b"connected to" in self.log_path.read_bytes()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def runs_of(target: str, job_id: int) -> list[dict[str, Any]]:
    out = wheelctl("runs", str(job_id), "--target", target, "--json", "--all").stdout
    runs: list[dict[str, Any]] = json.loads(out)
    return runs


def recorded(out: Path) -> list[tuple[str, int, int]]:
    if not out.exists():
        return []
    rows = []
    for line in out.read_text().splitlines():
        key, attempt, fence, _run = line.split()
        rows.append((key, int(attempt), int(fence)))
    return rows
