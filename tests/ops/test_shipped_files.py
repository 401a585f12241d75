"""The Prometheus rules and the Grafana dashboard in ``ops/`` name only
metrics that wheel nodes and workers export (a renamed metric must not
leave a rule that never fires), and the lag objective's rule reads the
bucket bound the node's histogram really has."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.ops._node import LiveNode
from wheel.node import NodeConfig
from wheel.worker import Worker

OPS = Path(__file__).resolve().parents[2] / "ops"
METRIC = re.compile(r"\bwheel_[a-z0-9_]+")


def names(text: str) -> set[str]:
    out: set[str] = set()
    for family in text_string_to_metric_families(text):
        out.add(family.name)
        out.update(s.name for s in family.samples)
    return out


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[set[str], str]]:
    """Every metric and sample name a node and a worker export, and the
    node's exposition text."""
    root = tmp_path_factory.mktemp("ops")
    config = NodeConfig(retain_ms=None, checkpoint_dir=str(root / "checkpoint"))
    with LiveNode(f"sqlite:///{root / 'wheel.db'}", config) as live:
        node = live.node
        assert node is not None
        # Collected on the node's loop, as its /metrics endpoint does.
        text = live.call(lambda: generate_latest(node.metrics.registry)).decode()
    worker = Worker("127.0.0.1:1", metrics_listen="127.0.0.1:0")
    assert worker.metrics is not None
    worker.metrics.observe("h", True, 0.1)
    worker_text = generate_latest(worker.metrics.registry).decode()
    yield names(text) | names(worker_text), text


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((OPS / "prometheus" / "alerts.yml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    doc = json.loads((OPS / "grafana" / "wheel.json").read_text())
    return [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]


def test_every_rule_names_only_exported_metrics(exported: tuple[set[str], str]) -> None:
    known, _ = exported
    found = rules()
    assert len(found) >= 10
    for rule in found:
        assert ("alert" in rule) != ("record" in rule) and rule["expr"].strip()
        unknown = set(METRIC.findall(rule["expr"])) - known
        assert not unknown, (rule.get("alert") or rule.get("record"), unknown)


def test_the_rules_cover_the_lag_objective_shards_store_and_reaper(
    exported: tuple[set[str], str],
) -> None:
    _, text = exported
    alerts = {r["alert"]: r for r in rules() if "alert" in r}
    assert {
        "WheelDispatchLagSLOBreached",
        "WheelNodeWithoutShards",
        "WheelStoreUnreachable",
        "WheelStoreErrors",
        "WheelReaperPaused",
    } <= alerts.keys()
    records = {r["record"]: r["expr"] for r in rules() if "record" in r}
    late = records["wheel:dispatch_late_ratio:5m"]
    bound = re.search(r'wheel_dispatch_lag_seconds_bucket\{le="([^"]+)"\}', late)
    assert bound is not None and bound.group(1) == "1.0"
    assert 'wheel_dispatch_lag_seconds_bucket{le="1.0"}' in text  # the bound as exported
    assert "wheel:dispatch_late_ratio:5m" in alerts["WheelDispatchLagSLOBreached"]["expr"]


def test_every_dashboard_query_names_only_exported_metrics(
    exported: tuple[set[str], str],
) -> None:
    known, _ = exported
    exprs = dashboard_exprs()
    assert len(exprs) >= 25
    for expr in exprs:
        unknown = set(METRIC.findall(expr)) - known
        assert not unknown, (expr, unknown)
