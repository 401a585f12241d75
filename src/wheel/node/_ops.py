"""What a node tells operators, and the housekeeping it does for them:
health, alerts, metrics, and the retention of finished history.

- **Health** is worked out every ``health_interval_s`` on the event loop: the
  store answers (the last dispatch batch committed, and, when no batch has
  committed for ``probe_after_s``, a probe did), and the node holds a shard
  it may dispatch. Listeners (the gRPC health service) hear of every change.
- **Alerts** come from the owner (``Actions.alerts``) and from the node (the
  store unreachable, the dispatch lag objective breached); each is kept with
  its time for ``AdminService.ListAlerts``, counted in
  ``wheel_alerts_total{kind}`` and logged with the ids it is about.
- **Retention** deletes finished runs and missed-fire records older than
  ``retain_ms``, one short store transaction at a time on a thread of its
  own, sleeping between them so that a pass takes at most
  ``retention_share`` of the store's time: dispatch batches wait behind one
  small transaction at most.
- **Statistics**: every ``statistics_interval_s`` the store's statistics of
  its busiest tables are brought up to date where they lag far behind the
  rows (``Store.refresh_statistics``), so that a plan made from those of a
  nearly empty table never reads every job where it wants the few due.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from wheel.engine.model import CONDITION_ALERTS, AlertKind
from wheel.engine.owner import Alert
from wheel.errors import StoreError
from wheel.logs import ids
from wheel.metrics import BatchedHistogram, LagMinute, LagRing
from wheel.node._metrics import LAG_BOUNDS_MS, MetricsSource, NodeMetrics
from wheel.node._stalls import StallTracer
from wheel.node._values import Clock, Health, NodeConfig, RaisedAlert
from wheel.store.base import Store

if TYPE_CHECKING:
    from wheel.coord.base import Coordinator
    from wheel.engine.driver import Driver

log = logging.getLogger("wheel.node")

HealthListener = Callable[[Health], Awaitable[None]]
# The stall watcher's tick (a stall is measured short by at most this), the
# least stall it counts, and the one it logs.
STALL_TICK_S = 0.02
STALL_FLOOR_S = 0.005
STALL_WARN_S = 0.1


class Ops:
    """Health, alerts, metrics and retention of a node."""

    def __init__(
        self,
        config: NodeConfig,
        store: Store,
        clock: Clock,
        coordinator: Coordinator | None,
        *,
        ready: asyncio.Event,
        driver: Callable[[], Driver | None],
        stopping: Callable[[], bool],
        source: MetricsSource,
    ) -> None:
        self._config = config
        self._store = store
        self._clock = clock
        self._coordinator = coordinator
        # Set once the node serves.
        self._ready = ready
        # The node's driver once it started, and whether it is stopping.
        self._driver = driver
        self._stopping = stopping
        config = self._config
        self.lag_histogram = BatchedHistogram(sorted({*LAG_BOUNDS_MS, config.lag_slo_ms}))
        self.metrics = NodeMetrics.create(source)
        self._batch_errors = self.metrics.store_errors.labels("batch")
        self.alerts: deque[RaisedAlert] = deque(maxlen=config.alerts_kept)
        # Written by the store thread (a bool or float assignment is atomic),
        # read by the loop; the last answer is a batch's commit or a probe's.
        self._batch_failed = False
        self._last_answer = time.monotonic()
        self._store_error = ""
        self._probe_failed = False
        self._probe: asyncio.Future[None] | None = None
        self._probe_started = 0.0
        self._reported: Health | None = None
        self._health_listeners: list[HealthListener] = []
        # (monotonic time, lag samples, samples within the objective).
        self._lag_window: deque[tuple[float, int, int]] = deque()
        self._lag_breached = False
        # Minute by minute over the last hour (AdminService.GetLagHistory).
        self.lag_ring = LagRing(self.lag_histogram.bounds_ms)
        self._probe_thread = ThreadPoolExecutor(1, thread_name_prefix="wheel-probe")
        self._purge_thread = ThreadPoolExecutor(1, thread_name_prefix="wheel-purge")
        self._ops_tasks: list[asyncio.Task[None]] = []
        self._stall_max_s = 0.0

    def start(self) -> None:
        self._ops_tasks = [
            asyncio.create_task(self._watch(), name="wheel-health"),
            asyncio.create_task(self._retain(), name="wheel-retention"),
            asyncio.create_task(self._keep_statistics(), name="wheel-statistics"),
            asyncio.create_task(self._watch_stalls(), name="wheel-stalls"),
        ]

    async def stop(self) -> None:
        for task in self._ops_tasks:
            task.cancel()
        for task in self._ops_tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # A probe or a purge step stuck on the store is not waited for.
        self._probe_thread.shutdown(wait=False, cancel_futures=True)
        self._purge_thread.shutdown(wait=False, cancel_futures=True)

    # -- event-loop stalls ------------------------------------------------------------

    async def _watch_stalls(self) -> None:
        """Ask the loop to wake every ``STALL_TICK_S`` and record how much
        later it did: whatever held the loop meanwhile (a load, a snapshot,
        a bulk submit, a garbage collection) stalled every stream and timer
        of the node as long.

        A timer callback, not a task that sleeps: each wake of a sleeping
        task costs a future and a second pass of the loop. An idle node spent
        22 ms of CPU a second on a task every 10 ms, 9 on this every 20 ms."""
        loop = asyncio.get_running_loop()
        histogram = self.metrics.loop_stall_seconds
        handle: asyncio.TimerHandle | None = None
        tracer = None
        if self._config.trace_stalls_s > 0:
            tracer = StallTracer(self._config.trace_stalls_s, clock=loop.time)
            tracer.start()

        def tick(asked: float) -> None:
            nonlocal handle
            now = loop.time()
            if tracer is not None:
                tracer.beat = now
            late = now - asked
            if late >= STALL_FLOOR_S:
                histogram.observe(late)
                if late > self._stall_max_s:
                    self._stall_max_s = late
                    if late >= STALL_WARN_S:
                        log.warning("the event loop stalled for %.0f ms", late * 1000)
            handle = loop.call_at(now + STALL_TICK_S, tick, now + STALL_TICK_S)

        first = loop.time() + STALL_TICK_S
        handle = loop.call_at(first, tick, first)
        try:
            await loop.create_future()  # until the node stops (cancelled)
        finally:
            handle.cancel()
            if tracer is not None:
                tracer.stop()

    def loop_stall_max_s(self) -> float:
        """The longest event-loop stall since the node started (s)."""
        return self._stall_max_s

    # -- health -----------------------------------------------------------------------

    def health(self) -> Health:
        """The node's health now (see the module docstring)."""
        return Health(
            store=not (self._batch_failed or self._probe_failed),
            dispatching=self._dispatching(),
        )

    def _dispatching(self) -> bool:
        driver = self._driver()
        if driver is None or not self._ready.is_set() or self._stopping():
            return False
        if not driver.shards():
            return False
        coordinator = self._coordinator
        return coordinator is None or time.monotonic() < coordinator.valid_until()

    def on_health(self, listener: HealthListener) -> None:
        """Await ``listener(health)`` whenever the node's health changes."""
        self._health_listeners.append(listener)

    def store_committed(self, seconds: float) -> None:
        """On the store thread: a batch committed after ``seconds``."""
        self._batch_failed = False
        self._last_answer = time.monotonic()
        self.metrics.store_batch_seconds.observe(seconds)

    def store_failed(self, exc: StoreError) -> None:
        """On the store thread: a batch failed (it is written again)."""
        self._batch_failed = True
        self._store_error = str(exc)
        self._batch_errors.inc()

    async def _watch(self) -> None:
        interval = self._config.health_interval_s
        while True:
            try:
                await self._probe_if_quiet()
                self._check_lag_objective()
                self._observe_lag()
                await self._report_health()
            except Exception:  # a bug here must not freeze what health says
                log.exception("working out the node's health failed")
            await asyncio.sleep(interval)

    async def _probe_if_quiet(self) -> None:
        """Ask the store when it has not answered lately: no batch committed
        and no probe answered for ``probe_after_s`` (an idle node, or one
        whose batch is stuck retrying)."""
        config = self._config
        now = time.monotonic()
        if now - self._last_answer < config.probe_after_s:
            self._probe_failed = False
            return
        probe = self._probe
        if probe is not None and not probe.done():
            if now - self._probe_started > config.probe_timeout_s:
                self._probe_down(f"no answer to a probe in {config.probe_timeout_s:g}s")
            return
        loop = asyncio.get_running_loop()
        self._probe = probe = loop.run_in_executor(self._probe_thread, self._store.ping)
        self._probe_started = now
        try:
            await asyncio.wait_for(asyncio.shield(probe), config.probe_timeout_s)
        except TimeoutError:
            self._probe_down(f"no answer to a probe in {config.probe_timeout_s:g}s")
        except StoreError as exc:
            self._probe_down(str(exc))
        else:
            self._probe_failed = False
            self._last_answer = time.monotonic()

    def _probe_down(self, why: str) -> None:
        self._probe_failed = True
        self._store_error = why
        self.metrics.store_errors.labels("probe").inc()

    async def _report_health(self) -> None:
        health = self.health()
        was = self._reported
        if health == was:
            return
        self._reported = health
        # The first report compares with a store that answered (the node
        # started on it): a store lost before this node's first look at it
        # still raises its alert, as the health service already says so.
        if health.store != (was is None or was.store):
            if health.store:
                log.info("the store answers again")
            else:
                self.raise_alert(
                    Alert(
                        kind=AlertKind.STORE_UNREACHABLE,
                        message=f"the store is unreachable: {self._store_error}",
                    )
                )
        if was is not None and health.dispatching != was.dispatching:
            log.info(
                "node %s %s",
                self._config.node_id,
                "holds shards to dispatch"
                if health.dispatching
                else "holds no shard it may dispatch",
            )
        for listener in self._health_listeners:
            try:
                await listener(health)
            except Exception:
                log.exception("a health listener failed")

    # -- alerts -----------------------------------------------------------------------

    def raise_alert(self, alert: Alert) -> None:
        """Keep, count and log an alert."""
        self.alerts.append(
            RaisedAlert(at_ms=self._clock.now_ms(), node_id=self._config.node_id, alert=alert)
        )
        self.metrics.alerts.labels(alert.kind.value).inc()
        extra = ids(
            job_id=alert.job_id, run_id=alert.run_id, fence=alert.fence, worker=alert.worker
        )
        extra["alert"] = alert.kind.value
        log.warning("alert: %s", alert.message, extra=extra)

    def list_alerts(self, since_ms: int = 0, limit: int = 0) -> list[RaisedAlert]:
        """Alerts raised at or after ``since_ms``, oldest first; with a
        ``limit``, the newest that many."""
        out = [a for a in self.alerts if a.at_ms >= since_ms]
        return out[-limit:] if limit > 0 else out

    def alerts_firing(self) -> Mapping[AlertKind, int]:
        """Each condition alert's kind -> how many of it hold now (0: clear)."""
        health = self.health()
        firing = dict.fromkeys(CONDITION_ALERTS, 0)
        firing[AlertKind.STORE_UNREACHABLE] = int(not health.store)
        firing[AlertKind.LAG_SLO] = int(self._lag_breached)
        driver = self._driver()
        if driver is not None:
            firing[AlertKind.REAPER_PAUSED] = int(driver.reaper_paused())
            limit = driver.unserved_alert_ms()
            now = self._clock.now_ms()
            firing[AlertKind.NO_WORKER] = sum(
                1 for u in driver.unserved() if now - u.since_ms >= limit
            )
        return firing

    def _check_lag_objective(self) -> None:
        """Over the last ``lag_slo_window_s``: more than 1 - quantile of the
        runs handed out later than ``lag_slo_ms`` breaches the objective (an
        alert); back within it clears it. Exact, not estimated: the
        objective is a bucket bound of the lag histogram."""
        config = self._config
        hist = self.lag_histogram
        now = time.monotonic()
        window = self._lag_window
        window.append((now, hist.count, hist.at_or_below(config.lag_slo_ms)))
        while len(window) > 1 and window[1][0] <= now - config.lag_slo_window_s:
            window.popleft()
        _, base_total, base_ok = window[0]
        _, total, ok = window[-1]
        samples, late = total - base_total, (total - base_total) - (ok - base_ok)
        breached = samples >= config.lag_slo_min_samples and late > samples * (
            1 - config.lag_slo_quantile
        )
        if breached == self._lag_breached:
            return
        self._lag_breached = breached
        if breached:
            self.raise_alert(
                Alert(
                    kind=AlertKind.LAG_SLO,
                    message=f"dispatch lag over its objective: {late} of {samples} runs in the"
                    f" last {config.lag_slo_window_s:g}s went out more than"
                    f" {config.lag_slo_ms} ms late (p{config.lag_slo_quantile * 100:g}"
                    f" <= {config.lag_slo_ms} ms)",
                )
            )
        else:
            log.info("dispatch lag is back within its objective")

    # -- metrics ----------------------------------------------------------------------

    def _observe_lag(self) -> None:
        hist = self.lag_histogram
        self.lag_ring.observe(self._clock.now_ms(), hist.buckets(), hist.take_peak())

    def lag_history(self) -> list[LagMinute]:
        """The dispatch lag minute by minute over the last hour, oldest first."""
        self._observe_lag()
        return self.lag_ring.history(self._clock.now_ms())

    # -- retention --------------------------------------------------------------------

    async def _retain(self) -> None:
        config = self._config
        if config.retain_ms is None:
            return
        await asyncio.sleep(min(config.retention_first_s, config.retention_interval_s))
        while True:
            if self._housekeeper():
                try:
                    await self.purge_history(config.retain_ms)
                except Exception:  # the next pass tries again
                    log.exception("retention pass failed")
            await asyncio.sleep(config.retention_interval_s)

    def _housekeeper(self) -> bool:
        """Whether this node does the housekeeping of the tables: the one
        node, or the member of a cluster that holds shard 0 (the tables are
        the cluster's, not a shard's)."""
        driver = self._driver()
        return self._coordinator is None or (driver is not None and 0 in driver.shards())

    async def _keep_statistics(self) -> None:
        interval = self._config.statistics_interval_s
        if interval <= 0:
            return
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            if not self._housekeeper():
                continue
            started = time.perf_counter()
            try:
                analyzed = await loop.run_in_executor(
                    self._purge_thread, self._store.refresh_statistics
                )
            except Exception as exc:  # the next round tries again
                log.warning("refreshing the store's statistics failed: %s", exc)
                continue
            if analyzed:
                log.info(
                    "statistics of %s brought up to date in %.2fs",
                    ", ".join(f"{table} ({changed} rows changed)" for table, changed in analyzed),
                    time.perf_counter() - started,
                )

    async def purge_history(self, retain_ms: int) -> int:
        """One retention pass: delete finished runs and missed-fire records
        older than ``retain_ms``, paced (see the module docstring); returns
        the rows deleted. A store error ends the pass early (the next one
        goes on where this stopped: nothing is half-deleted)."""
        config = self._config
        share = min(1.0, max(0.01, config.retention_share))
        cutoff = self._clock.now_ms() - retain_ms
        steps: Iterator[int] = self._store.purge_steps(cutoff, config.retention_batch)
        loop = asyncio.get_running_loop()
        total, started = 0, time.perf_counter()
        while True:
            step_started = time.perf_counter()
            try:
                deleted = await loop.run_in_executor(self._purge_thread, next, steps, None)
            except StoreError as exc:
                self.metrics.store_errors.labels("purge").inc()
                log.warning("retention pass stopped after %d rows: %s", total, exc)
                return total
            if deleted is None:
                break
            total += deleted
            self.metrics.purged_rows.inc(deleted)
            took = time.perf_counter() - step_started
            await asyncio.sleep(took * (1 - share) / share)
        try:  # the audit trail follows the same horizon (a few rows a day)
            total += await loop.run_in_executor(self._purge_thread, self._store.purge_audit, cutoff)
        except StoreError as exc:
            self.metrics.store_errors.labels("purge").inc()
            log.warning("retention: the audit trail was not purged: %s", exc)
        self.metrics.purge_passes.inc()
        if total:
            log.info(
                "retention: deleted %d finished runs and missed fires older than %d ms in %.1fs",
                total,
                retain_ms,
                time.perf_counter() - started,
            )
        return total
