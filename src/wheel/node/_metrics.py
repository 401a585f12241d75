"""A node's Prometheus metrics.

Two kinds, so that the dispatch path pays nothing for them:

- What the owner counts already (fires, claims, dispatches, run endings,
  missed fires, lease expiries...) and what the node holds (runs in flight,
  backlog, shards, workers, firing alerts) is read when Prometheus scrapes,
  by ``NodeCollector``, on the event loop (see ``wheel.metrics``): no
  counter is incremented twice and no gauge is kept up to date between
  scrapes.
- What happens off the owner -- a store batch's latency, store errors,
  alerts raised, rows purged -- goes into ``prometheus_client`` metrics as it
  happens: a few per second at most, from whichever thread sees it.

The dispatch lag histogram is fed in batches (``BatchedHistogram``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    ProcessCollector,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from wheel.engine.model import AlertKind, MissedReason, RunState
from wheel.metrics import BatchedHistogram
from wheel.node._values import Health, NodeStatus
from wheel.store.base import LimitRecord

# Dispatch lag buckets (ms): 1 s is a bound, so the objective "p99 <= 1 s" is
# exact on the histogram (``histogram_quantile`` interpolates between bounds).
LAG_BOUNDS_MS = (1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000)
STORE_BATCH_BUCKETS_S = (
    0.0005,
    0.001,
    0.0025,
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
)
# Event-loop stalls (s): how much later than asked a 10 ms timer ran.
LOOP_STALL_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# Waits for a permit of a concurrency key (s).
LIMIT_WAIT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
# What ``wheel_store_errors_total{op}`` counts.
STORE_OPS = ("batch", "probe", "changes", "purge")


class MetricsSource(Protocol):
    """What the collector reads of a node (``wheel.node.Node``)."""

    lag_histogram: BatchedHistogram

    def status(self, *, percentiles: bool = True) -> NodeStatus: ...

    def health(self) -> Health: ...

    def alerts_firing(self) -> Mapping[AlertKind, int]: ...

    def checkpoint_log_records(self) -> int | None: ...

    def loop_stall_max_s(self) -> float: ...

    def limit_census(self) -> tuple[list[LimitRecord], dict[tuple[str, str], int]]: ...


@dataclass(frozen=True, slots=True)
class NodeMetrics:
    """A node's registry and the metrics updated as things happen."""

    registry: CollectorRegistry
    store_batch_seconds: Histogram
    loop_stall_seconds: Histogram
    store_errors: Counter
    alerts: Counter
    purged_rows: Counter
    purge_passes: Counter
    limit_wait_seconds: Histogram

    @classmethod
    def create(cls, source: MetricsSource) -> NodeMetrics:
        """A registry of its own (several nodes in one process, as in tests,
        do not collide), with ``NodeCollector`` reading ``source``."""
        registry = CollectorRegistry(auto_describe=True)
        metrics = cls(
            registry=registry,
            store_batch_seconds=Histogram(
                "wheel_store_batch_seconds",
                "Time to commit one dispatch-loop batch (claims, completions, missed"
                " fires, schedule moves) to the store, retries included.",
                buckets=STORE_BATCH_BUCKETS_S,
                registry=registry,
            ),
            loop_stall_seconds=Histogram(
                "wheel_loop_stall_seconds",
                "Event-loop stalls: how much later than asked a 10 ms timer of the node's"
                " loop ran (time spent in Python between awaits: loads, snapshots, bulk"
                " submits, garbage collection). Stalls under 5 ms are not counted.",
                buckets=LOOP_STALL_BUCKETS_S,
                registry=registry,
            ),
            store_errors=Counter(
                "wheel_store_errors_total",
                "Store calls that failed, by operation: batch (a dispatch batch, retried"
                " until it commits), probe (the health probe), changes (the change feed),"
                " purge (retention).",
                ["op"],
                registry=registry,
            ),
            alerts=Counter(
                "wheel_alerts_total",
                "Alerts raised, by kind (also in AdminService.ListAlerts).",
                ["kind"],
                registry=registry,
            ),
            purged_rows=Counter(
                "wheel_retention_purged_rows_total",
                "Finished runs and missed-fire records deleted past the retention horizon.",
                registry=registry,
            ),
            purge_passes=Counter(
                "wheel_retention_passes_total",
                "Retention passes run to their end.",
                registry=registry,
            ),
            limit_wait_seconds=Histogram(
                "wheel_limit_wait_seconds",
                "How long fires waited for a permit of their concurrency key before their"
                " claim was won (only fires that waited).",
                buckets=LIMIT_WAIT_BUCKETS_S,
                registry=registry,
            ),
        )
        # Every label value from the start: a rate over a series that appears
        # with its first increment misses that increment.
        for op in STORE_OPS:
            metrics.store_errors.labels(op)
        for kind in AlertKind:
            metrics.alerts.labels(kind.value)
        registry.register(NodeCollector(source))
        # The process's CPU, memory, descriptors and garbage collections.
        ProcessCollector(registry=registry)
        GCCollector(registry=registry)
        return metrics


class NodeCollector(Collector):
    """Reads the node when scraped: the owner's counters, what is in flight
    and waiting, shards, workers, health and the lag histogram."""

    def __init__(self, source: MetricsSource) -> None:
        self.source = source

    def describe(self) -> list[Metric]:
        # Nothing up front: collecting at registration would read a node
        # that is not started yet.
        return []

    def collect(self) -> Iterator[Metric]:
        node = self.source
        st = node.status(percentiles=False)
        s = st.stats
        yield _counter("wheel_fires_total", "Fires of job schedules that came due.", s.fires)
        claims = CounterMetricFamily(
            "wheel_claims_total",
            "Fire claims the store answered: won (an execution row), lost (the fire"
            " attempt was held already).",
            labels=["result"],
        )
        claims.add_metric(["won"], s.claims_won)
        claims.add_metric(["lost"], s.claims_lost)
        yield claims
        yield _counter("wheel_dispatches_total", "Runs handed to a worker.", s.dispatched)
        ended = CounterMetricFamily(
            "wheel_run_completions_total",
            "Runs whose terminal state the store applied, by outcome (superseded: the"
            " completion lost to a newer fence).",
            labels=["outcome"],
        )
        by_state = s.ended_by_state()
        for state in RunState:
            if state not in (RunState.DISPATCHED, RunState.RUNNING):
                ended.add_metric([state.value], by_state.get(state, 0))
        ended.add_metric(["superseded"], s.superseded_completions)
        yield ended
        missed = CounterMetricFamily(
            "wheel_missed_fires_total",
            "Fires not run, recorded as missed, by reason.",
            labels=["reason"],
        )
        for reason in MissedReason:
            missed.add_metric([reason.value], s.missed_by_reason.get(reason, 0))
        yield missed
        yield _counter(
            "wheel_lease_expiries_total",
            "Run leases that lapsed (the worker went silent or away).",
            s.lost_leases,
        )
        yield _counter(
            "wheel_redispatches_total",
            "Fires dispatched again as a new attempt after a lost lease (by the reaper).",
            s.redispatched,
        )
        yield _counter(
            "wheel_retries_total", "Failed attempts retried after their backoff.", s.retried
        )
        yield _counter("wheel_run_timeouts_total", "Runs that ran past their timeout.", s.timed_out)
        yield _gauge("wheel_runs_in_flight", "Runs claimed and not yet ended.", st.in_flight)
        yield _gauge(
            "wheel_backlog",
            "Fires due and runs claimed that wait for a worker (overdue ones included).",
            st.backlog,
        )
        yield _gauge(
            "wheel_overdue_backlog",
            "Of the backlog, work later than --overdue-after-ms: catch-up work.",
            st.overdue_backlog,
        )
        yield _gauge("wheel_jobs", "Jobs held by this node's shards.", st.jobs)
        yield _gauge(
            "wheel_pending_timers",
            "Timers pending: the wheel's, and the next fires of jobs at rest.",
            st.pending_timers,
        )
        yield _gauge(
            "wheel_jobs_awake",
            "Jobs held as objects (work going on, or a fire due soon); the others"
            " rest as packed rows.",
            st.jobs_awake,
        )
        yield _gauge(
            "wheel_loop_stall_max_seconds",
            "The longest event-loop stall since the node started.",
            node.loop_stall_max_s(),
        )
        yield _lag_histogram(node.lag_histogram)
        logged = node.checkpoint_log_records()
        if logged is not None:
            yield _gauge(
                "wheel_checkpoint_log_records",
                "Job records in the checkpoint's log since its last snapshot: what a"
                " restart replays.",
                logged,
            )
        yield _gauge("wheel_shards_owned", "Shards this node holds.", len(st.shards))
        epochs = GaugeMetricFamily(
            "wheel_shard_epoch", "The ownership epoch of each shard held.", labels=["shard"]
        )
        for shard, epoch in sorted(st.shards.items()):
            epochs.add_metric([str(shard)], epoch)
        yield epochs
        yield _gauge("wheel_workers_connected", "Worker streams connected.", len(st.workers))
        capacity = GaugeMetricFamily(
            "wheel_worker_capacity", "Runs a worker takes at once.", labels=["worker"]
        )
        held = GaugeMetricFamily("wheel_worker_held", "Runs a worker holds.", labels=["worker"])
        credit = GaugeMetricFamily(
            "wheel_worker_credit",
            "Runs the node may still hand a worker (0 while it drains or is silent).",
            labels=["worker"],
        )
        for w in st.workers:
            capacity.add_metric([w.worker_id], w.capacity)
            held.add_metric([w.worker_id], w.held)
            free = 0 if w.draining or w.silent else max(0, w.capacity - w.held)
            credit.add_metric([w.worker_id], free)
        yield capacity
        yield held
        yield credit
        firing = node.alerts_firing()
        alerts = GaugeMetricFamily(
            "wheel_alerts_firing",
            "Alert conditions holding now, by kind (reaper_paused, no_worker: routes"
            " waiting, store_unreachable, lag_slo); event kinds are in wheel_alerts_total.",
            labels=["kind"],
        )
        for kind in sorted(firing):
            alerts.add_metric([kind.value], firing[kind])
        yield alerts
        health = node.health()
        yield _gauge("wheel_store_up", "1 while the store answers.", int(health.store))
        yield _gauge(
            "wheel_dispatching",
            "1 while the node holds a shard it may dispatch.",
            int(health.dispatching),
        )
        yield from _limits(*node.limit_census())


def _limits(limits: list[LimitRecord], waiting: Mapping[tuple[str, str], int]) -> Iterator[Metric]:
    in_flight = GaugeMetricFamily(
        "wheel_limit_in_flight",
        "Runs of a concurrency key dispatched or running across the cluster (as the"
        " node last read the store, about every second).",
        labels=["tenant", "key"],
    )
    for r in limits:
        in_flight.add_metric([r.tenant, r.key], r.in_flight)
    yield in_flight
    waits = GaugeMetricFamily(
        "wheel_limit_waiting",
        "Fires waiting on this node for a permit of their concurrency key.",
        labels=["tenant", "key"],
    )
    keys = {(r.tenant, r.key) for r in limits} | set(waiting)
    for tenant, key in sorted(keys):
        waits.add_metric([tenant, key], waiting.get((tenant, key), 0))
    yield waits


def _counter(name: str, doc: str, value: int) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _lag_histogram(hist: BatchedHistogram) -> HistogramMetricFamily:
    cumulative = hist.buckets()
    buckets = [(_le(b / 1000), n) for b, n in zip(hist.bounds_ms, cumulative, strict=False)]
    buckets.append(("+Inf", cumulative[-1]))
    return HistogramMetricFamily(
        "wheel_dispatch_lag_seconds",
        "How late a run's first attempt was handed to a worker, after its fire was due.",
        buckets=buckets,
        sum_value=hist.sum_ms / 1000,
    )


def _le(seconds: float) -> str:
    """A bucket bound as Prometheus clients print it (1.0, 0.0025)."""
    return repr(float(seconds))
