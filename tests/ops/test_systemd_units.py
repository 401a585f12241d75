"""The systemd units in ``ops/systemd/``: systemd itself finds nothing to
say about them (``systemd-analyze verify``), their hardening stays rated
low-exposure (``systemd-analyze security``), they stop with SIGTERM and
give the node's hand-over and the worker's drain the time those take, and
their example environment files make command lines ``wheelctl`` accepts.
Running those command lines for real is in tests/installed/."""

from __future__ import annotations

import inspect
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from testkit.systemd import Unit, read_environment_file
from wheel.app import AppConfig
from wheel.cli import build_parser
from wheel.coord.etcd import EtcdCoordinator
from wheel.worker._process import run_worker

SYSTEMD = Path(__file__).resolve().parents[2] / "ops" / "systemd"
NODE = SYSTEMD / "wheel-node.service"
WORKER = SYSTEMD / "wheel-worker@.service"
# Where the units expect the package: a virtualenv at /opt/wheel.
WHEELCTL = "/opt/wheel/bin/wheelctl"
# systemd-analyze security's 0-10 scale: 10 is a unit without any hardening.
MAX_EXPOSURE = 2.5


def units() -> list[Unit]:
    return [Unit.load(NODE), Unit.load(WORKER, instance="reports")]


def analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("systemd-analyze is missing")
        pytest.skip("systemd-analyze is missing (Debian's systemd package)")
    return found


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A root for ``systemd-analyze --root``: the host's own units (the
    targets ours order after), ours in /etc/systemd/system, and an
    executable where the units look for wheelctl."""
    host_units = Path("/usr/lib/systemd/system")
    if not host_units.is_dir():
        pytest.skip("no systemd units on this machine to verify against")
    shutil.copytree(host_units, tmp_path / "usr/lib/systemd/system", symlinks=True)
    ours = tmp_path / "etc/systemd/system"
    ours.mkdir(parents=True)
    for unit in (NODE, WORKER):
        shutil.copy(unit, ours / unit.name)
    stub = tmp_path / WHEELCTL.lstrip("/")
    stub.parent.mkdir(parents=True)
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    return tmp_path


@pytest.mark.parametrize("name", ["wheel-node.service", "wheel-worker@reports.service"])
def test_systemd_analyze_verify_finds_nothing_to_say(root: Path, name: str) -> None:
    """An unknown key or a bad value is only a warning for systemd, so the
    output must be empty as well as the exit status 0."""
    out = subprocess.run(
        [analyze(), "verify", f"--root={root}", name], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout + out.stderr == ""


@pytest.mark.parametrize("name", ["wheel-node.service", "wheel-worker@reports.service"])
def test_systemd_analyze_rates_the_hardening_low_exposure(root: Path, name: str) -> None:
    """``--threshold`` is on a 0-100 scale: the exit status is not 0 above it."""
    threshold = f"--threshold={MAX_EXPOSURE * 10:.0f}"
    out = subprocess.run(
        [analyze(), "security", "--offline=true", f"--root={root}", threshold, name],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("unit", units(), ids=lambda u: u.name)
def test_a_unit_stops_with_sigterm_and_restarts_only_after_a_failure(unit: Unit) -> None:
    assert unit.one("KillSignal") == "SIGTERM"
    # The main process alone gets SIGTERM: a handler's child processes run on
    # while the worker drains, and SIGKILL ends whatever is left.
    assert unit.one("KillMode") == "mixed"
    assert unit.one("Restart") == "on-failure"
    assert unit.one("ExecStart").startswith(f"{WHEELCTL} ")


def test_the_node_is_given_the_time_a_planned_hand_over_takes() -> None:
    """A leaving member waits for the others to load its shards, then its
    gRPC calls drain; a few seconds more for the store and the checkpoint."""
    handoff = inspect.signature(EtcdCoordinator).parameters["handoff_timeout_s"].default
    drain = AppConfig.__dataclass_fields__["drain_s"].default
    assert isinstance(handoff, float) and isinstance(drain, float)
    assert Unit.load(NODE).seconds("TimeoutStopSec") >= handoff + drain + 10


def test_a_worker_is_given_the_time_its_drain_takes() -> None:
    drain = inspect.signature(run_worker).parameters["drain_timeout"].default
    assert Unit.load(WORKER, instance="a").seconds("TimeoutStopSec") >= drain + 10


@pytest.mark.parametrize("unit", units(), ids=lambda u: u.name)
def test_a_unit_runs_confined(unit: Unit) -> None:
    for key, value in {
        "DynamicUser": "yes",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "CapabilityBoundingSet": "",
        "AmbientCapabilities": "",
    }.items():
        assert unit.one(key) == value, key
    assert "@system-service" in unit.all("SystemCallFilter")


def test_the_node_keeps_its_data_in_its_state_directory() -> None:
    node = Unit.load(NODE)
    assert node.one("StateDirectory") == "wheel"
    argv = node.command({"STATE_DIRECTORY": "/var/lib/wheel"})
    assert argv[argv.index("--data-dir") + 1] == "/var/lib/wheel"


def test_the_example_environment_files_make_commands_wheelctl_accepts() -> None:
    node = Unit.load(NODE)
    env = node.environment({"/etc/wheel/node.env": (SYSTEMD / "node.env").read_text()})
    argv = node.command({**env, "STATE_DIRECTORY": "/var/lib/wheel"})
    assert argv[:4] == [WHEELCTL, "serve", "--data-dir", "/var/lib/wheel"]
    ns = build_parser().parse_args(argv[1:])
    assert (ns.listen, ns.http_listen) == ("127.0.0.1:50051", "127.0.0.1:8080")

    worker = Unit.load(WORKER, instance="reports")
    env = worker.environment({"/etc/wheel/worker.env": (SYSTEMD / "worker.env").read_text()})
    assert env["PYTHONPATH"] == "/opt/wheel/handlers"
    ns = build_parser().parse_args(worker.command(env)[1:])
    assert ns.worker_id.endswith("-reports")
    assert (ns.target, ns.handlers) == (["127.0.0.1:50051"], ["myhandlers:worker"])


def test_a_worker_instance_reads_its_own_environment_file_after_the_shared_one() -> None:
    worker = Unit.load(WORKER, instance="b")
    env = worker.environment(
        {
            "/etc/wheel/worker.env": "WHEEL_WORKER_FLAGS='--capacity 4 m:h'\nA=1\n",
            "/etc/wheel/worker-b.env": 'WHEEL_WORKER_FLAGS="--capacity 2 m:h"\n',
        }
    )
    assert env == {"WHEEL_WORKER_FLAGS": "--capacity 2 m:h", "A": "1"}
    with pytest.raises(FileNotFoundError):
        worker.environment({"/etc/wheel/worker-b.env": ""})


def test_systemd_words_of_a_command_line() -> None:
    """``$NAME`` alone is split into words (none when empty), ``${NAME}`` is
    one value wherever it stands."""
    unit = Unit.load(NODE)
    env = {"STATE_DIRECTORY": "/var/lib/a b", "WHEEL_NODE_FLAGS": "  --x 1   --y  "}
    assert unit.command(env)[2:] == ["--data-dir", "/var/lib/a b", "--x", "1", "--y"]
    assert unit.command({})[2:] == ["--data-dir", ""]
    assert read_environment_file("# c\n; c\n\n  K='a b'  \n") == {"K": "a b"}
    with pytest.raises(ValueError, match="escapes"):
        read_environment_file('K="a\\"b"')
