"""Prometheus metrics of a node and of a worker: a histogram fed in batches
(``BatchedHistogram``), and an HTTP endpoint that collects a registry on the
process's event loop (``MetricsServer``), so that collectors read the state
they report without locks and without a thread of their own."""

from wheel.metrics._histogram import BatchedHistogram
from wheel.metrics._http import MetricsServer, parse_listen
from wheel.metrics._lag import LagMinute, LagRing

__all__ = ["BatchedHistogram", "LagMinute", "LagRing", "MetricsServer", "parse_listen"]
