"""The scheduler's shared vocabulary: job and run states, missed-fire reasons,
alert kinds, shards and idempotency keys. Pure values, used by the engine and every layer
above it."""

from __future__ import annotations

from enum import StrEnum
from typing import Final

SHARD_COUNT = 256
# The built-in handler of jobs with an HTTP target (``wheel.http_targets``):
# only a worker that names it among its handlers (``wheelctl worker --http``)
# takes its runs, never one that takes any handler.
HTTP_HANDLER = "http"


class JobState(StrEnum):
    """A job's state. A one-shot whose fire was claimed schedules nothing
    more (``SCHEDULE_OVER``) and its state says how its fire ended: it is
    ``running`` while a run or a retry of the fire is owed, ``completed``
    once one succeeded, ``failed`` once the fire was dead-lettered (or its
    at_most_once run's outcome is unknown). A redrive that succeeds makes a
    failed one-shot completed. Databases from before ``running`` and
    ``failed`` hold ``completed`` for every claimed one-shot; the end of
    its run sets it as above."""

    ACTIVE = "active"
    PAUSED = "paused"
    CANCELLED = "cancelled"
    # A one-shot whose fire succeeded.
    COMPLETED = "completed"
    # A one-shot whose fire was claimed and has not ended for good yet.
    RUNNING = "running"
    # A one-shot whose fire was dead-lettered, or ended unknown.
    FAILED = "failed"


class RunState(StrEnum):
    DISPATCHED = "dispatched"  # claimed and handed out; grace lease
    RUNNING = "running"  # acked by a worker; full lease
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # this attempt failed; a retry may follow as attempt + 1
    TIMED_OUT = "timed_out"  # ran past timeout_ms
    LOST = "lost"  # lease expired; a new attempt re-dispatches the fire
    DEAD_LETTERED = "dead_lettered"  # failed on its last attempt
    UNKNOWN = "unknown"  # at_most_once run whose lease was lost: outcome unknown
    CANCELLED = "cancelled"  # the job was cancelled while this run was in flight


TERMINAL_RUN_STATES = frozenset(RunState) - {RunState.DISPATCHED, RunState.RUNNING}

# A one-shot whose fire was claimed: nothing more to schedule.
SCHEDULE_OVER = frozenset({JobState.RUNNING, JobState.COMPLETED, JobState.FAILED})


def one_shot_end(run: RunState) -> JobState | None:
    """The state a claimed one-shot takes when its fire's run ends so: None
    while a retry or a re-dispatch may follow (or the run was cancelled)."""
    if run is RunState.SUCCEEDED:
        return JobState.COMPLETED
    if run is RunState.DEAD_LETTERED or run is RunState.UNKNOWN:
        return JobState.FAILED
    return None


class MissedReason(StrEnum):
    OUTSIDE_WINDOW = "outside_window"  # later than the catch-up window allows
    OVER_CAP = "over_cap"  # run_all past max_count: collapsed to the latest
    SKIPPED = "skipped"  # catch-up mode skip
    COLLAPSED = "collapsed"  # run_latest_only ran a later fire instead
    PAUSED = "paused"  # came due while the job was paused
    OVERLAP = "overlap"  # came due while a previous run was still going
    DST_GAP = "dst_gap"  # wall time did not exist and the policy skips it
    CANCELLED = "cancelled"  # queued or buffered when the job was cancelled
    CALENDAR = "calendar"  # on a day of a calendar the job skips


class AlertKind(StrEnum):
    """What an alert is about. Some name a condition that holds for a while
    (a node reports them as firing until it clears), the others an event."""

    # Conditions.
    REAPER_PAUSED = "reaper_paused"  # the reaper's circuit breaker: the fleet is too busy or empty
    NO_WORKER = "no_worker"  # work waits for a handler no connected worker serves
    STORE_UNREACHABLE = "store_unreachable"  # the last store batch or probe failed
    LAG_SLO = "lag_slo"  # dispatch lag p99 over its objective
    # Events.
    CATCH_UP_CAPPED = "catch_up_capped"  # run_all past its cap collapsed to the latest
    DEAD_LETTERED = "dead_lettered"  # a fire failed its last attempt
    OUTCOME_UNKNOWN = "outcome_unknown"  # an at_most_once run lost its lease


CONDITION_ALERTS = frozenset(
    {
        AlertKind.REAPER_PAUSED,
        AlertKind.NO_WORKER,
        AlertKind.STORE_UNREACHABLE,
        AlertKind.LAG_SLO,
    }
)


# Fibonacci hashing's multiplier (2^64 / the golden ratio), and in 21-bit
# limbs for ``shard_of``.
# (Final: compiled, each is a constant, not a lookup in the module's dict.)
_FIB: Final = 0x9E3779B97F4A7C15
_M21: Final = 0x1FFFFF
_F0: Final = 0x0A7C15  # _FIB & _M21
_F1: Final = 0x0DCBFA  # (_FIB >> 21) & _M21
_F2: Final = 0x278DDE  # _FIB >> 42


def shard_of(job_id: int) -> int:
    """The shard a job lives on (fixed per cluster)."""
    # Fibonacci hashing spreads sequential ids evenly over the shards: the
    # shard is bits 56..63 of job_id * _FIB. That product is a big integer
    # (an allocation, ~0.5 us compiled, and a job's shard is asked for more
    # than once a fire), so it is taken apart in 21-bit limbs whose partial
    # products stay machine-sized: with S = t0 + t1 2^21 + t2 2^42 + t3 2^63
    # (mod 2^64), bits 42..63 of S are t2 + (t3 & 1) 2^21 plus the carries
    # out of the two low terms, and the shard is their bits 14..21.
    if job_id < 0 or job_id >> 63:
        return ((job_id * _FIB) >> 56) & 0xFF
    a0, a1, a2 = job_id & _M21, (job_id >> 21) & _M21, job_id >> 42
    t1 = a0 * _F1 + a1 * _F0
    carry = (a0 * _F0 + ((t1 & _M21) << 21)) >> 42
    top = a0 * _F2 + a1 * _F1 + a2 * _F0 + (((a1 * _F2 + a2 * _F1) & 1) << 21)
    return ((top + (t1 >> 21) + carry) >> 14) & 0xFF


def idempotency_key(job_id: int, scheduled_for: int) -> str:
    """Stable across attempts: derived from the fire, never from the attempt."""
    return f"{job_id}:{scheduled_for}"
