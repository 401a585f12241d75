"""The container recipe in ``ops/container/`` read as a whole, with no
container engine: compose.yaml runs only images build.sh makes, its nodes'
and workers' commands are ones ``wheelctl`` accepts and agree with each
other (one cluster, one store, one secrets key, each node advertising its
own service name), and Prometheus scrapes exactly the nodes and workers
compose.yaml runs, with the rules its image is given. Running it all for
real is tests/installed/test_container.py."""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path
from typing import Any

import yaml

from wheel.cli import build_parser

CONTAINER = Path(__file__).resolve().parents[2] / "ops" / "container"
NODES = ("node-1", "node-2", "node-3")
WORKERS = ("worker-1", "worker-2")


def services() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load((CONTAINER / "compose.yaml").read_text())
    found: dict[str, dict[str, Any]] = doc["services"]
    return found


def parsed(service: dict[str, Any]) -> argparse.Namespace:
    return build_parser().parse_args(service["command"])


def test_the_compose_file_runs_the_whole_cluster_from_the_images_build_sh_makes() -> None:
    found = services()
    assert set(found) == {"etcd", "postgres", *NODES, *WORKERS, "prometheus"}
    build = (CONTAINER / "build.sh").read_text()
    # build.sh tags the package's image :latest and each part's image from
    # its directory beside it.
    assert "-t localhost/wheel-scheduler:latest" in build
    assert "for part in etcd postgres prometheus; do" in build
    for name, service in found.items():
        image = service["image"]
        if name in NODES or name in WORKERS:
            assert image == "localhost/wheel-scheduler:latest", name
        else:
            assert image == f"localhost/wheel-scheduler-{name}:bookworm", name
            assert (CONTAINER / name / "Dockerfile").is_file()


def test_the_nodes_join_one_cluster_over_one_store_each_at_its_own_name() -> None:
    found = services()
    nodes = {name: parsed(found[name]) for name in NODES}
    assert {ns.command for ns in nodes.values()} == {"serve"}
    assert {ns.cluster for ns in nodes.values()} == {"etcd://etcd:2379/wheel"}
    assert {ns.store for ns in nodes.values()} == {"postgresql://wheel@postgres:5432/wheel"}
    for name, ns in nodes.items():
        assert ns.node_id == name
        assert ns.advertise == f"{name}:50051"
        assert (ns.listen, ns.metrics_listen) == ("0.0.0.0:50051", "0.0.0.0:9100")
        # Every node reads the one secrets key the compose file declares.
        assert ns.secrets_key_file == "/run/secrets/secrets_key"
        assert found[name]["secrets"] == ["secrets_key"]
        # Its data directory (the image's /var/lib/wheel) is a volume of its own.
        assert found[name]["volumes"] == [f"{name}:/var/lib/wheel"]
    # The database password reaches PostgreSQL's first start and the nodes alike.
    password = found["postgres"]["environment"]["POSTGRES_PASSWORD"]
    assert {found[n]["environment"]["PGPASSWORD"] for n in NODES} == {password}


def test_the_workers_reach_every_node_and_run_handlers_that_exist() -> None:
    found = services()
    for name in WORKERS:
        ns = parsed(found[name])
        assert ns.command == "worker"
        assert ns.worker_id == name
        assert ns.target == [",".join(f"{n}:50051" for n in NODES)]
        assert ns.metrics_listen == "0.0.0.0:9100"
        for handler in ns.handlers:
            module, function = handler.split(":")
            assert callable(getattr(importlib.import_module(module), function))
        # No gRPC health service on a worker: the image's check is off.
        assert found[name]["healthcheck"] == {"test": ["NONE"]}


def test_prometheus_scrapes_the_compose_files_nodes_and_workers_with_the_alert_rules() -> None:
    config = yaml.safe_load((CONTAINER / "prometheus" / "prometheus.yml").read_text())
    targets = {
        job["job_name"]: set(job["static_configs"][0]["targets"])
        for job in config["scrape_configs"]
    }
    assert targets == {
        "wheel-node": {f"{n}:9100" for n in NODES},
        "wheel-worker": {f"{w}:9100" for w in WORKERS},
    }
    # The image copies the rules (build.sh puts ops/prometheus/alerts.yml
    # beside its Dockerfile) where the configuration reads them.
    dockerfile = (CONTAINER / "prometheus" / "Dockerfile").read_text()
    assert "COPY prometheus.yml alerts.yml /etc/prometheus/" in dockerfile
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    assert "ops/prometheus/alerts.yml" in (CONTAINER / "build.sh").read_text()


def test_the_image_runs_wheelctl_as_a_user_of_its_own_with_the_nodes_health_check() -> None:
    dockerfile = (CONTAINER / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["wheelctl"]' in dockerfile
    assert "USER wheel" in dockerfile
    assert "STOPSIGNAL SIGTERM" in dockerfile
    assert re.search(r'^HEALTHCHECK .* CMD \["wheel-health"\]$', dockerfile, re.MULTILINE)
    health = (CONTAINER / "wheel-health").read_text()
    # The service whose health says the node answers and its store does.
    assert '"wheel.rpc.v1.JobService"' in health
