"""The container recipe run for real: ops/container/build.sh makes the images
from Debian's packages and the installed package's wheel, and
ops/container/compose.yaml starts etcd, PostgreSQL, three nodes, two
workers and Prometheus with podman-compose. The three nodes join one
cluster and share its shards, each node's health check passes, a job
submitted through node-1's published port runs on a worker container, and
Prometheus scrapes every node and worker with the shipped alert rules. A
node container stopped with the image's SIGTERM hands its shards to the
other two and exits 0.

Opt-in with ``WHEEL_CONTAINER_TEST=1`` (then podman and podman-compose must
be installed, and root may run containers): building the images takes
minutes the first time (debootstrap's base is kept and reused), which
``scripts/test.sh`` does not spend on every run."""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from testkit.procs import wait_for
from testkit.services import free_port
from tests.installed.conftest import Installed, check, clean_env

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("WHEEL_CONTAINER_TEST", "") in ("", "0"),
        reason="set WHEEL_CONTAINER_TEST=1 to build the images and run compose.yaml",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
CONTAINER = ROOT / "ops" / "container"
NODES = ("node-1", "node-2", "node-3")
WORKERS = ("worker-1", "worker-2")


@dataclass(frozen=True, slots=True)
class Cluster:
    """compose.yaml's project, up: its name and the host ports published."""

    project: str
    api: str
    prometheus: int

    def container(self, service: str) -> str:
        # podman-compose names a service's container PROJECT_SERVICE_1.
        return f"{self.project}_{service}_1"


def engine() -> tuple[str, str]:
    podman, compose = shutil.which("podman"), shutil.which("podman-compose")
    assert podman and compose, "WHEEL_CONTAINER_TEST=1 needs podman and podman-compose"
    return podman, compose


def run(
    *argv: str | Path, what: str, env: Mapping[str, str] | None = None, timeout: float = 120
) -> str:
    proc = subprocess.run(
        [str(a) for a in argv], env={**clean_env(), **(env or {})}, capture_output=True,
        text=True, timeout=timeout,
    )  # fmt: skip
    check(proc, what)
    return proc.stdout


@pytest.fixture(scope="module")
def cluster(installed: Installed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    podman, compose = engine()
    # The wheels of the dependencies for the Python the tests run on (3.11,
    # as bookworm's: build.sh refuses another).
    build = CONTAINER / "build.sh"
    run(build, installed.wheel, what="build.sh", env={"PYTHON": sys.executable}, timeout=1200)
    tmp = tmp_path_factory.mktemp("container")
    key = tmp / "secrets.key"
    key.write_text(base64.b64encode(secrets.token_bytes(32)).decode() + "\n")
    key.chmod(0o444)  # read by the nodes' user, uid 10001
    cluster = Cluster(f"wheeltest{os.getpid()}", f"127.0.0.1:{free_port()}", free_port())
    env = {
        "WHEEL_SECRETS_KEY": str(key),
        "WHEEL_DB_PASSWORD": secrets.token_hex(12),
        "WHEEL_API_PORT": cluster.api.rsplit(":", 1)[1],
        "WHEEL_CONSOLE_PORT": str(free_port()),
        "WHEEL_PROMETHEUS_PORT": str(cluster.prometheus),
    }
    project = (compose, "-p", cluster.project, "-f", CONTAINER / "compose.yaml")
    try:
        run(*project, "up", "-d", what="podman-compose up", env=env)
        yield cluster
    finally:
        for service in ("etcd", "postgres", *NODES, *WORKERS, "prometheus"):
            logs = subprocess.run(
                [podman, "logs", "--tail", "30", cluster.container(service)],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            print(f"----- {service} -----\n{logs.stdout}{logs.stderr}")
        subprocess.run(
            [*project, "down", "-v", "-t", "45"], env={**clean_env(), **env},
            capture_output=True, timeout=300,
        )  # fmt: skip
        # podman-compose 1.0 leaves the project's network behind.
        network = f"{cluster.project}_default"
        subprocess.run([podman, "network", "rm", "-f", network], capture_output=True, timeout=60)


def wheelctl(installed: Installed, cluster: Cluster, *argv: str) -> Any:
    out = installed.run(installed.wheelctl, *argv, "--target", cluster.api, "--json")
    check(out, f"wheelctl {argv[0]}")
    return json.loads(out.stdout)


def healthy(cluster: Cluster, service: str) -> bool:
    podman, _ = engine()
    argv = [podman, "healthcheck", "run", cluster.container(service)]
    return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0


def test_three_node_containers_join_one_cluster_and_pass_their_health_check(
    installed: Installed, cluster: Cluster
) -> None:
    for service in ("etcd", "postgres", *NODES):
        wait_for(partial(healthy, cluster, service), 120, f"{service}'s health check", 1)

    def members() -> dict[str, Any] | None:
        status = wheelctl(installed, cluster, "status")
        holding = {n["node_id"] for n in status["nodes"] if n["shards_owned"] > 0}
        return status if holding == set(NODES) else None

    status = wait_for(members, 120, "three members holding shards", 1)
    assert sum(n["shards_owned"] for n in status["nodes"]) == 256
    # Each at the address it advertises on the project's network.
    assert {n["address"] for n in status["nodes"]} == {f"{n}:50051" for n in NODES}


def test_a_job_submitted_through_node_1_runs_on_a_worker_container(
    installed: Installed, cluster: Cluster
) -> None:
    submitted = wheelctl(
        installed, cluster, "submit", "--name", "from-the-host", "--handler", "hello",
        "--at", "+0s", "--payload", "container",
    )  # fmt: skip
    job = str(submitted["job_id"])

    def succeeded() -> list[dict[str, Any]]:
        runs: list[dict[str, Any]] = wheelctl(installed, cluster, "runs", job)
        return [r for r in runs if r["state"] == "succeeded"]

    (run,) = wait_for(succeeded, 120, "the job's run on a worker", 1)
    assert run["worker_id"] in WORKERS


def test_prometheus_scrapes_every_node_and_worker_with_the_alert_rules(
    cluster: Cluster,
) -> None:
    api = f"http://127.0.0.1:{cluster.prometheus}/api/v1"

    def get(path: str) -> Any:
        with urllib.request.urlopen(f"{api}/{path}", timeout=5) as answer:
            return json.load(answer)["data"]

    def up() -> set[str] | None:
        try:
            targets = get("targets")["activeTargets"]
        except OSError:
            return None
        found = {t["labels"]["instance"] for t in targets if t["health"] == "up"}
        return found if len(found) == len(NODES) + len(WORKERS) else None

    # The first scrape comes within the 15 s scrape interval.
    found = wait_for(up, 120, "Prometheus to scrape every node and worker", 1)
    assert found == {f"{name}:9100" for name in (*NODES, *WORKERS)}
    groups = get("rules")["groups"]
    alerts = {r["name"] for g in groups for r in g["rules"] if r["type"] == "alerting"}
    assert "WheelDispatchLagSLOBreached" in alerts


def test_a_node_container_stopped_hands_its_shards_over_and_exits_0(
    installed: Installed, cluster: Cluster
) -> None:
    podman, _ = engine()
    # The image's STOPSIGNAL, SIGTERM: a planned hand-over, well within 45 s.
    run(podman, "stop", "-t", "45", cluster.container("node-3"), what="podman stop", timeout=60)
    argv = [podman, "inspect", "--format", "{{.State.ExitCode}}", cluster.container("node-3")]
    assert run(*argv, what="podman inspect").strip() == "0"

    def two_members() -> dict[str, Any] | None:
        status: dict[str, Any] = wheelctl(installed, cluster, "status")
        owned = {n["node_id"]: n["shards_owned"] for n in status["nodes"]}
        return status if set(owned) == {"node-1", "node-2"} and sum(owned.values()) == 256 else None

    wait_for(two_members, 60, "node-1 and node-2 to hold every shard", 1)
    logs = subprocess.run(
        [podman, "logs", cluster.container("node-3")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30,
    ).stdout  # fmt: skip
    assert "handed over" in logs, logs
