"""A worker's Prometheus metrics (``Worker(metrics_listen=...)``,
``wheelctl worker --metrics-listen``).

Runs by outcome, what is held and executing, and the streams are read from
the worker when scraped (``WorkerCollector``: the counters ``WorkerStats``
keeps anyway). The handler duration histogram is observed as runs end, one
labelled child per handler and outcome, looked up once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from wheel.worker._api import WorkerStats

HANDLER_BUCKETS_S = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    1800.0,
)


class WorkerSource(Protocol):
    """What the collector reads of a worker (``wheel.worker.Worker``)."""

    stats: WorkerStats
    capacity: int

    @property
    def connected(self) -> int: ...

    @property
    def held(self) -> int: ...

    @property
    def executing(self) -> int: ...


class WorkerMetrics:
    """A worker's registry, and the handler duration histogram."""

    def __init__(self, source: WorkerSource) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._durations = Histogram(
            "wheel_worker_handler_duration_seconds",
            "From a handler's start to its outcome, by handler and outcome (succeeded,"
            " failed: raised or timed out).",
            ["handler", "outcome"],
            buckets=HANDLER_BUCKETS_S,
            registry=self.registry,
        )
        self._children: dict[tuple[str, bool], Histogram] = {}
        self.registry.register(WorkerCollector(source))

    def observe(self, handler: str, succeeded: bool, seconds: float) -> None:
        key = (handler, succeeded)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._durations.labels(
                handler, "succeeded" if succeeded else "failed"
            )
        child.observe(seconds)


class WorkerCollector(Collector):
    def __init__(self, source: WorkerSource) -> None:
        self.source = source

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        w = self.source
        s = w.stats
        runs = CounterMetricFamily(
            "wheel_worker_runs_total",
            "Runs by outcome: succeeded, failed (raised), timed_out, revoked (superseded:"
            " aborted, never completed), handed_back (never started), abandoned (given up"
            " at the end of a drain).",
            labels=["outcome"],
        )
        for outcome, n in (
            ("succeeded", s.succeeded),
            ("failed", s.failed - s.timed_out),
            ("timed_out", s.timed_out),
            ("revoked", s.revoked),
            ("handed_back", s.handed_back),
            ("abandoned", s.abandoned),
        ):
            runs.add_metric([outcome], n)
        yield runs
        yield CounterMetricFamily(
            "wheel_worker_runs_received_total", "Assignments received.", value=s.received
        )
        yield CounterMetricFamily(
            "wheel_worker_completions_rejected_total",
            "Completions a node refused (a newer fence superseded the run).",
            value=s.rejected,
        )
        yield CounterMetricFamily(
            "wheel_worker_reconnects_total", "Streams opened again.", value=s.reconnects
        )
        yield CounterMetricFamily(
            "wheel_worker_runs_moved_total",
            "Runs re-homed to another node because their shard moved.",
            value=s.moved,
        )
        yield GaugeMetricFamily(
            "wheel_worker_capacity_runs", "Handlers run at once at most.", value=w.capacity
        )
        yield GaugeMetricFamily(
            "wheel_worker_held_runs", "Runs held (executing or waiting).", value=w.held
        )
        yield GaugeMetricFamily(
            "wheel_worker_executing_runs", "Handlers executing now.", value=w.executing
        )
        yield GaugeMetricFamily(
            "wheel_worker_streams_connected", "Lease streams up.", value=w.connected
        )
