"""The systemd units' commands, run for real from the installed package.

Each unit's ``ExecStart=`` is read as systemd reads it (its specifiers, its
environment files, ``${STATE_DIRECTORY}``) and run as it stands, with one
change: the units' /opt/wheel is the test's fresh virtualenv. The node
serves from its state directory, a worker started from the worker unit's
command runs a job, and SIGTERM (the units' ``KillSignal=``) ends each with
status 0 within the unit's ``TimeoutStopSec=``. Run again under strace,
every system call the two processes made is one the unit's
``SystemCallFilter=`` allows.

What this cannot show here: the rest of the unit's sandbox (a dynamic user,
the read-only file system, the namespaces) as systemd would set it up. This
machine's PID 1 is not systemd, so nothing can start a unit;
tests/ops/test_systemd_units.py has systemd check the unit files
themselves."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit.procs import wait_for
from testkit.services import free_port
from testkit.systemd import Unit, allowed_syscalls, strace_summary_calls, syscall_groups
from tests.installed.conftest import Installed, check

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD = ROOT / "ops" / "systemd"
TESTKIT = ROOT / "testkit"
# Where the units expect the package's virtualenv.
PREFIX = "/opt/wheel/"
# System calls the processes make here only because the tests run as root.
AS_ROOT_ONLY = {"fchown"}
# What systemd gives a system service before the unit's own variables.
SERVICE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/",
    "SHELL": "/usr/sbin/nologin",
}


@dataclass(frozen=True, slots=True)
class Started:
    """A unit's process: ``proc`` is strace when traced, ``pid`` the
    service's main process (the one systemd would signal)."""

    proc: subprocess.Popen[bytes]
    pid: int
    log: Path


def traced_child(strace: subprocess.Popen[bytes], command: str) -> int:
    """The process strace started for ``command`` (strace's other children
    are its short-lived probes of what ptrace can do here)."""

    def child() -> int | None:
        pids = Path(f"/proc/{strace.pid}/task/{strace.pid}/children").read_text().split()
        for pid in pids:
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                words = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
                # Not yet exec'd, a child is strace's copy; then a script's
                # interpreter runs it, the command one of its arguments.
                if words[0] != "strace" and command in words:
                    return int(pid)
        return None

    found: int = wait_for(child, 10, "strace to start its command", interval=0.01)
    return found


@contextmanager
def service(
    unit: Unit,
    files: Mapping[str, str],
    installed: Installed,
    log: Path,
    trace: Path | None = None,
    **extra: str,
) -> Iterator[Started]:
    """``unit``'s ExecStart= running as systemd would start it: the
    environment it gives the service (``extra``: what systemd adds, such as
    STATE_DIRECTORY), the command line made from it, the working directory
    /. ``trace``: under ``strace -f -c``, its summary written there. Killed
    if the test left it running."""
    env = {**SERVICE_ENV, **extra, **unit.environment(files)}
    argv = unit.command(env)
    assert argv[0].startswith(PREFIX), argv
    argv[0] = command = str(installed.venv / argv[0].removeprefix(PREFIX))
    if trace is not None:
        argv = ["strace", "-f", "-qq", "-c", "-o", str(trace), *argv]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, cwd="/", stdout=out, stderr=out)
    pid = proc.pid
    try:
        pid = proc.pid if trace is None else traced_child(proc, command)
        yield Started(proc, pid, log)
    finally:
        if proc.poll() is None:
            # The service's process first: strace killed would leave it running.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.wait()


def stop_as_systemd_does(unit: Unit, started: Started) -> None:
    """Send the unit's KillSignal= to its main process and wait out its
    TimeoutStopSec=: the process must exit with status 0 within it."""
    assert unit.one("KillSignal") == "SIGTERM"
    timeout = unit.seconds("TimeoutStopSec")
    os.kill(started.pid, signal.SIGTERM)
    try:
        status = started.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        log = started.log.read_text()
        pytest.fail(f"{unit.name} still running {timeout}s after SIGTERM:\n{log}")
    assert status == 0, f"{unit.name} exited {status}:\n{started.log.read_text()}"


def up(started: Started, line: str, what: str) -> None:
    """Wait for ``line`` in the process's log; it must still be running."""
    wait_for(
        lambda: started.proc.poll() is not None or line in started.log.read_text(),
        60,
        what,
    )
    assert started.proc.poll() is None, started.log.read_text()


@pytest.mark.parametrize("traced", [False, True], ids=["plain", "strace"])
def test_the_units_commands_serve_run_a_job_and_stop_on_sigterm(
    installed: Installed, tmp_path: Path, traced: bool
) -> None:
    if traced and shutil.which("strace") is None:
        pytest.skip("no strace to see the system calls with")
    if traced and shutil.which("systemd-analyze") is None:
        pytest.skip("no systemd-analyze to read the system call groups from")
    state = tmp_path / "state"
    state.mkdir()
    port = free_port()
    target = f"127.0.0.1:{port}"
    ran = tmp_path / "ran.txt"
    node = Unit.load(SYSTEMD / "wheel-node.service")
    worker = Unit.load(SYSTEMD / "wheel-worker@.service", instance="svc")
    node_files = {"/etc/wheel/node.env": f'WHEEL_NODE_FLAGS="--listen {target}"\n'}
    worker_files = {
        "/etc/wheel/worker.env": (
            f"PYTHONPATH={TESTKIT}\n"
            f"WHEEL_E2E_OUT={ran}\n"
            f'WHEEL_WORKER_FLAGS="--target {target} e2e_handlers:record"\n'
        ),
    }
    traces = {"node": tmp_path / "node.strace", "worker": tmp_path / "worker.strace"}

    def trace(name: str) -> Path | None:
        return traces[name] if traced else None

    node_run = service(
        node, node_files, installed, tmp_path / "node.log", trace("node"),
        STATE_DIRECTORY=str(state),
    )  # fmt: skip
    with node_run as serving:
        # The line scripts wait for: the node serves, its signal handlers set.
        up(serving, f"wheel serving on {target}", "the node to serve")
        # Its data is in the state directory the unit gives it.
        assert (state / "wheel.db").exists()
        assert (state / "node.lock").exists()

        worker_log = tmp_path / "worker.log"
        worker_run = service(worker, worker_files, installed, worker_log, trace("worker"))
        with worker_run as working:
            up(working, "connected to", "the worker to connect")
            submitted = installed.run(
                installed.wheelctl, "submit", "--target", target, "--json",
                "--name", "from-a-unit", "--handler", "record", "--at", "+0s",
            )  # fmt: skip
            check(submitted, "wheelctl submit")
            job = json.loads(submitted.stdout)["job_id"]

            def runs() -> list[dict[str, object]]:
                argv = ("runs", str(job), "--target", target, "--json")
                out = installed.run(installed.wheelctl, *argv)
                check(out, "wheelctl runs")
                found: list[dict[str, object]] = json.loads(out.stdout)
                return found

            wait_for(lambda: [r for r in runs() if r["state"] == "succeeded"], 60, "the run")
            (run,) = runs()
            # The worker is HOST-INSTANCE, as the unit's --worker-id %H-%i says.
            assert run["worker_id"] == f"{socket.gethostname()}-svc"
            assert ran.read_text().count("\n") == 1

            stop_as_systemd_does(worker, working)
        stop_as_systemd_does(node, serving)

    if traced:
        groups = syscall_groups("systemd-analyze")
        for unit, name in ((node, "node"), (worker, "worker")):
            made = strace_summary_calls(traces[name].read_text())
            assert "epoll_wait" in made or "epoll_pwait" in made  # the summary was read
            if os.geteuid() == 0:
                # SQLite gives its journal files the database's owner when it
                # runs as root, which a unit's dynamic user never is.
                made -= AS_ROOT_ONLY
            refused = made - allowed_syscalls(unit, groups)
            assert refused == set(), f"{unit.name}'s SystemCallFilter= refuses {sorted(refused)}"
