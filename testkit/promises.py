"""The one checker of wheel's promises to its users (``docs/design.md``,
"The promise to users"), numbered as they are there:

1. At-least-once execution, never a silent drop.
2. Never early.
3. Exactly-once effect needs the handler (a stable idempotency key per fire,
   fences that refuse a stale write, at_most_once never sent again).
4. Per-job serialization.
5. Jobs submitted and acknowledged are never lost.

Two harnesses judge a history by ``check`` below: the nemesis
(``benchmarks/chaos.py``), from what a real cluster leaves behind, and the
simulator (``tests/engine/sim_check.py``), from its simulated one. The simulator
sees more (the reference store's log of every claim and completion, the
owner, each worker's messages) and applies stricter rules of its own on top,
each judged there and nowhere else. Every rule is named in ``RULES`` with the
promise it guards, so a failure reads as "promise 3, no stale fence: ..."
whichever harness found it.

``check`` works from two records that wheel does not write for itself, the
plan of what was submitted (the load's own word for every acknowledged job
and its schedule) and the handlers' effect log and fenced resource, against
the record of truth (executions, missed_fires). It imports nothing from
wheel: which fires were due is computed here from the plan (or listed in it
by a harness that knows the schedule), not asked of wheel's schedule code.

A fire is ``(job, scheduled_for)``; "due" means scheduled at or before the
judged window's end. What it reports (``Verdict``):

- ``fires``: fires due; ``fires_run``: of those, fires some attempt of which
  started (the effect log says so);
- ``lost``: due, never succeeded, not dead-lettered, not ``unknown`` (an
  at_most_once run whose lease was lost), not recorded missed;
- ``early``: attempts that started (the worker's clock) before their fire's
  scheduled time;
- ``duplicates``: fires with two or more successes accepted by the store;
- ``stale_fence_accepted``: successes the store accepted whose fence is not
  the newest of their fire's attempts, plus writes the fenced resource
  accepted with a fence older than one it had already accepted;
- ``missed_without_reason``: missed records whose reason is not one the
  job's policy allows (``PlannedJob.may_miss``), or that the history
  contradicts: the fire also has an execution; ``collapsed`` with no later
  fire of the job claimed;
  ``overlap`` with no earlier fire of the job holding its slot between the
  fire's due time and the record (a fire holds it from its first dispatch
  until its last attempt ends for good, through the wait for a retry or a
  re-dispatch);
- ``unknown``: at_most_once runs that ended ``unknown``;
- ``max_late_s``: the longest any fire that ran waited past its due time
  (its first start minus its scheduled time).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from itertools import pairwise
from typing import Any


class Promise(IntEnum):
    """The promises of ``docs/design.md``, by their number there."""

    NO_SILENT_DROP = 1
    NEVER_EARLY = 2
    EFFECT_ONCE_WITH_THE_HANDLER = 3
    PER_JOB_SERIALIZATION = 4
    ACKNOWLEDGED_NEVER_LOST = 5


# Every rule a harness checks, and the promise it guards. The simulator's own
# rules first (``tests/engine/sim_check.py``: what only it can see), then the
# counts of ``Verdict`` that must be zero (``check``, both harnesses).
RULES: dict[str, Promise] = {
    # An active fixed_delay job always has its next fire armed or a run
    # going (its fires are known only as its runs end, so no plan lists them) ...
    "no silent drop": Promise.NO_SILENT_DROP,
    # ... failed attempts retried until max_attempts, and no further ...
    "retries": Promise.NO_SILENT_DROP,
    "retries stop": Promise.NO_SILENT_DROP,
    "retries use every attempt": Promise.NO_SILENT_DROP,
    # (a fire due during the drain: one owed by the end not settled is ``lost``)
    "retries continue": Promise.NO_SILENT_DROP,
    # ... dispatched only to a worker that can run it, and a schedule never
    # moved back (which would fire a fire twice or pass one by).
    "routing": Promise.NO_SILENT_DROP,
    "schedule moves forward": Promise.NO_SILENT_DROP,
    # Never claimed before its jittered due time nor handed out before its
    # fire (``early`` below judges the handler's start).
    "never early": Promise.NEVER_EARLY,
    "stable idempotency key": Promise.EFFECT_ONCE_WITH_THE_HANDLER,
    "fenced assignment": Promise.EFFECT_ONCE_WITH_THE_HANDLER,
    "fences increase": Promise.EFFECT_ONCE_WITH_THE_HANDLER,
    "no stale fence": Promise.EFFECT_ONCE_WITH_THE_HANDLER,
    "valid completion accepted": Promise.EFFECT_ONCE_WITH_THE_HANDLER,
    # An at_most_once run lost is unknown, and one timed out is never run
    # again (sent again after a lost or unknown one: ``at_most_once_redispatched``).
    "at_most_once": Promise.EFFECT_ONCE_WITH_THE_HANDLER,
    "per-job serialization": Promise.PER_JOB_SERIALIZATION,
    # ``check``'s counts (``Verdict.violations``).
    "lost": Promise.NO_SILENT_DROP,
    "missed_without_reason": Promise.NO_SILENT_DROP,
    "early": Promise.NEVER_EARLY,
    "duplicates": Promise.EFFECT_ONCE_WITH_THE_HANDLER,
    "stale_fence_accepted": Promise.EFFECT_ONCE_WITH_THE_HANDLER,
    "at_most_once_redispatched": Promise.EFFECT_ONCE_WITH_THE_HANDLER,
    "success_with_refused_effect": Promise.EFFECT_ONCE_WITH_THE_HANDLER,
}


@dataclass(frozen=True, slots=True)
class Violation:
    """A rule of ``RULES`` broken, and what broke it."""

    rule: str
    detail: str

    @property
    def promise(self) -> Promise:
        return RULES[self.rule]

    def __str__(self) -> str:
        return f"[promise {self.promise.value}, {self.rule}] {self.detail}"


# Missed reasons a job may have under the chaos workload's policies
# (run_latest_only catch-up with no window, overlap skip, UTC schedules, no
# pause or cancel): a later fire ran instead, or a run was still going.
ALLOWED_MISSED = frozenset({"collapsed", "overlap"})
# Execution states that settle a fire for good.
SETTLED = frozenset({"succeeded", "dead_lettered", "unknown"})
# An attempt that ended so: another attempt of its fire is owed (or, if it
# was the last one, it has not ended yet in the store's eyes).
OWED_ANOTHER = frozenset({"dispatched", "running", "lost", "failed", "timed_out"})
EPOCH_SHIFT = 32


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedJob:
    """One acknowledged job as the load submitted it."""

    job_id: int
    kind: str  # "once", "interval", "cron" or "listed"
    at_most_once: bool = False
    # once: its time; interval: its first fire (fires at first + k * period).
    first_ms: int = 0
    period_ms: int = 0
    # cron: the seconds of every minute it fires at (seconds-field cron),
    # judged from ``from_ms`` on (a fire's first occurrence after creation
    # depends on the clock of the node that took the submit).
    seconds: tuple[int, ...] = ()
    from_ms: int = 0
    # listed: the fires it owes, worked out by a harness that knows the
    # schedule (time zones, jitter, pauses, triggers), not by this module.
    fires: tuple[int, ...] = ()
    behaviour: str = "ok"
    # Why a fire of it may be recorded missed: what its policies allow, plus
    # "cancelled" for a fire due by its cancellation and "dst_gap" at an
    # instant its schedule skips wall times at.
    missed_reasons: frozenset[str] = ALLOWED_MISSED
    cancelled_at_ms: int | None = None
    dst_gaps: frozenset[int] = frozenset()

    def fires_until(self, end_ms: int) -> list[int]:
        if self.kind == "once":
            return [self.first_ms] if self.first_ms <= end_ms else []
        if self.kind == "interval":
            return list(range(self.first_ms, end_ms + 1, self.period_ms))
        if self.kind == "listed":
            return sorted(f for f in self.fires if f <= end_ms)
        out = []
        minute = self.from_ms // 60_000 * 60_000
        while minute <= end_ms:
            for second in self.seconds:
                t = minute + second * 1000
                if self.from_ms <= t <= end_ms:
                    out.append(t)
            minute += 60_000
        return out

    def may_miss(self, fire: int, reason: str) -> bool:
        """Whether its policies can record this fire missed for this reason."""
        if reason == "cancelled":
            return self.cancelled_at_ms is not None and fire <= self.cancelled_at_ms
        if reason == "dst_gap":
            return fire in self.dst_gaps
        return reason in self.missed_reasons

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "kind": self.kind,
            "at_most_once": self.at_most_once,
            "first_ms": self.first_ms,
            "period_ms": self.period_ms,
            "seconds": list(self.seconds),
            "from_ms": self.from_ms,
            "fires": list(self.fires),
            "behaviour": self.behaviour,
            "missed_reasons": sorted(self.missed_reasons),
            "cancelled_at_ms": self.cancelled_at_ms,
            "dst_gaps": sorted(self.dst_gaps),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PlannedJob:
        return cls(
            **{
                **d,
                "seconds": tuple(d.get("seconds", ())),
                "fires": tuple(d.get("fires", ())),
                "missed_reasons": frozenset(d.get("missed_reasons", ALLOWED_MISSED)),
                "dst_gaps": frozenset(d.get("dst_gaps", ())),
            }
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One execution row."""

    run_id: int
    job_id: int
    scheduled_for: int
    attempt: int
    state: str
    fence: int
    worker_id: str | None = None
    dispatched_at_ms: int = 0
    finished_at_ms: int | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Missed:
    job_id: int
    scheduled_for: int
    reason: str
    recorded_at_ms: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ResourceWrite:
    """One write asked of the fenced per-job resource, in the order it took them."""

    seq: int
    job_id: int
    key: str
    fence: int
    run_id: int
    accepted: bool


Fire = tuple[int, int]


@dataclass(slots=True, kw_only=True)
class Verdict:
    fires: int = 0
    fires_run: int = 0
    lost: list[Fire] = field(default_factory=list)
    early: list[dict[str, Any]] = field(default_factory=list)
    duplicates: list[Fire] = field(default_factory=list)
    stale_fence_accepted: list[dict[str, Any]] = field(default_factory=list)
    missed_without_reason: list[dict[str, Any]] = field(default_factory=list)
    unknown: list[Fire] = field(default_factory=list)
    # Extras: not violations by themselves, or told apart for the reader.
    at_most_once_redispatched: list[Fire] = field(default_factory=list)
    success_with_refused_effect: list[dict[str, Any]] = field(default_factory=list)
    unknown_with_effect: int = 0
    effects_repeated: int = 0
    dead_lettered: int = 0
    missed: dict[str, int] = field(default_factory=dict)
    max_late_s: float = 0.0
    late_p99_s: float = 0.0
    latest: Fire | None = None

    def violations(self) -> dict[str, int]:
        """Every count that must be zero."""
        return {
            "lost": len(self.lost),
            "early": len(self.early),
            "duplicates": len(self.duplicates),
            "stale_fence_accepted": len(self.stale_fence_accepted),
            "missed_without_reason": len(self.missed_without_reason),
            "at_most_once_redispatched": len(self.at_most_once_redispatched),
            "success_with_refused_effect": len(self.success_with_refused_effect),
        }

    def by_promise(self) -> dict[Promise, int]:
        """The counts of ``violations`` summed by the promise each guards."""
        out: dict[Promise, int] = {}
        for rule, n in self.violations().items():
            out[RULES[rule]] = out.get(RULES[rule], 0) + n
        return out

    def fires_involved(self) -> list[Fire]:
        """The fires behind every violation, for the failure report."""
        out: list[Fire] = [*self.lost, *self.duplicates, *self.at_most_once_redispatched]
        for item in (
            *self.early,
            *self.stale_fence_accepted,
            *self.missed_without_reason,
            *self.success_with_refused_effect,
        ):
            out.append((int(item["job"]), int(item["scheduled_for"])))
        return list(dict.fromkeys(out))


def check(
    jobs: Iterable[PlannedJob],
    runs: Sequence[Run],
    missed: Sequence[Missed],
    effects: Sequence[Mapping[str, Any]],
    writes: Sequence[ResourceWrite],
    *,
    end_ms: int,
    overlap_tolerance_ms: int = 2_000,
) -> Verdict:
    """Judge every fire due by ``end_ms`` of ``jobs`` (see the module doc).

    ``overlap_tolerance_ms``: slack for comparing an ``overlap`` miss with
    run times the nodes' clocks wrote (a skewed node's times are off by its
    skew)."""
    v = Verdict()
    plan = {j.job_id: j for j in jobs}
    runs_of: dict[Fire, list[Run]] = defaultdict(list)
    runs_of_job: dict[int, list[Run]] = defaultdict(list)
    for r in runs:
        runs_of[(r.job_id, r.scheduled_for)].append(r)
        runs_of_job[r.job_id].append(r)
    missed_of = {(m.job_id, m.scheduled_for): m for m in missed}
    starts: dict[Fire, float] = {}
    ends: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for e in effects:
        fire = (int(e["job"]), int(e["scheduled_for"]))
        if e["kind"] == "start":
            t = float(e["t"])
            starts[fire] = min(t, starts.get(fire, t))
            if int(t * 1000) < fire[1]:
                v.early.append(
                    {
                        "job": fire[0],
                        "scheduled_for": fire[1],
                        "run": e["run"],
                        "attempt": e["attempt"],
                        "fence": e["fence"],
                        "early_ms": fire[1] - int(t * 1000),
                    }
                )
        elif e["kind"] == "end":
            ends[int(e["run"])].append(e)

    # Every fire the store or the handlers saw, judged or not.
    lates: list[float] = []
    due = {(j.job_id, t) for j in plan.values() for t in j.fires_until(end_ms)}
    v.fires = len(due)
    for fire in sorted(due):
        fire_runs = runs_of.get(fire, [])
        states = {r.state for r in fire_runs}
        if fire in starts:
            v.fires_run += 1
            late = starts[fire] - fire[1] / 1000
            lates.append(late)
            if late > v.max_late_s:
                v.max_late_s, v.latest = late, fire
        if "dead_lettered" in states:
            v.dead_lettered += 1
        if "unknown" in states:
            v.unknown.append(fire)
        if not states & SETTLED and fire not in missed_of:
            v.lost.append(fire)
    if lates:
        lates.sort()
        v.late_p99_s = lates[min(len(lates) - 1, int(0.99 * len(lates)))]

    for fire, fire_runs in runs_of.items():
        successes = [r for r in fire_runs if r.state == "succeeded"]
        if len(successes) > 1:
            v.duplicates.append(fire)
        newest = max(r.fence for r in fire_runs)
        for r in successes:
            if r.fence < newest:
                v.stale_fence_accepted.append(
                    {
                        "job": fire[0],
                        "scheduled_for": fire[1],
                        "where": "store",
                        "run": r.run_id,
                        "fence": r.fence,
                        "newest": newest,
                    }
                )
            refused = [e for e in ends.get(r.run_id, []) if e.get("accepted") is False]
            if refused and r.fence == newest:
                v.success_with_refused_effect.append(
                    {"job": fire[0], "scheduled_for": fire[1], "run": r.run_id, "fence": r.fence}
                )
        job = plan.get(fire[0])
        if job is not None and job.at_most_once:
            by_attempt = sorted(fire_runs, key=lambda r: r.attempt)
            for before, after in pairwise(by_attempt):
                if before.state in ("lost", "unknown") and after.attempt > before.attempt:
                    v.at_most_once_redispatched.append(fire)
                    break
        for r in fire_runs:
            if r.state == "unknown" and any(
                e.get("outcome") in ("succeeded", "crash") for e in ends.get(r.run_id, [])
            ):
                v.unknown_with_effect += 1

    newest_write: dict[int, ResourceWrite] = {}
    for w in sorted(writes, key=lambda w: w.seq):
        if not w.accepted:
            continue
        last = newest_write.get(w.job_id)
        if last is not None and w.fence < last.fence:
            v.stale_fence_accepted.append(
                {
                    "job": w.job_id,
                    "scheduled_for": int(w.key.rsplit(":", 1)[-1]),
                    "where": "resource",
                    "run": w.run_id,
                    "fence": w.fence,
                    "newest": last.fence,
                }
            )
        else:
            newest_write[w.job_id] = w

    successes_by_fire: dict[Fire, int] = defaultdict(int)
    for run_ends in ends.values():
        for e in run_ends:
            if e.get("outcome") in ("succeeded", "crash"):
                successes_by_fire[(int(e["job"]), int(e["scheduled_for"]))] += 1
    v.effects_repeated = sum(1 for n in successes_by_fire.values() if n > 1)

    counts: dict[str, int] = defaultdict(int)
    for fire, m in missed_of.items():
        counts[m.reason] += 1
        why = _unjustified(m, plan.get(m.job_id), runs_of, runs_of_job, overlap_tolerance_ms)
        if why:
            v.missed_without_reason.append(
                {"job": fire[0], "scheduled_for": fire[1], "reason": m.reason, "why": why}
            )
    v.missed = dict(sorted(counts.items()))
    return v


def _unjustified(
    m: Missed,
    job: PlannedJob | None,
    runs_of: Mapping[Fire, list[Run]],
    runs_of_job: Mapping[int, list[Run]],
    tolerance_ms: int,
) -> str:
    """Why the history does not bear this missed record out ("" if it does)."""
    fire = (m.job_id, m.scheduled_for)
    allowed = m.reason in ALLOWED_MISSED if job is None else job.may_miss(fire[1], m.reason)
    if not allowed:
        return f"reason {m.reason!r} is not one this job's policy has"
    if runs_of.get(fire):
        return "the fire also has executions"
    job_runs = runs_of_job.get(m.job_id, [])
    if m.reason == "collapsed":
        if not any(r.scheduled_for > m.scheduled_for for r in job_runs):
            return "collapsed, but no later fire of the job was claimed"
        return ""
    if m.reason != "overlap":
        return ""  # the policy allows it and nothing in the history says otherwise
    # overlap: an earlier fire held the job's slot at some moment between
    # this fire's due time and the record (an owner that took the shard on
    # late judges an overdue fire when it gets to it, not when it was due).
    # A fire holds it from its first dispatch until its last attempt ends for
    # good: an attempt lost or failed is owed another (a re-dispatch, a
    # retry), and the fire holds the slot through the wait for it.
    earlier: dict[int, list[Run]] = defaultdict(list)
    for r in job_runs:
        if r.scheduled_for < m.scheduled_for:
            earlier[r.scheduled_for].append(r)
    for fire_runs in earlier.values():
        start = min(r.dispatched_at_ms for r in fire_runs)
        last = max(fire_runs, key=lambda r: r.attempt)
        end = None if last.state in OWED_ANOTHER else last.finished_at_ms
        if start > max(m.recorded_at_ms, m.scheduled_for) + tolerance_ms:
            continue
        if end is None or end >= m.scheduled_for - tolerance_ms:
            return ""
    return "overlap, but no earlier fire of the job held its slot then"


def summary(v: Verdict) -> dict[str, Any]:
    """The JSON figures of a verdict (counts, not the lists)."""
    return {
        "fires": v.fires,
        "fires_run": v.fires_run,
        "lost": len(v.lost),
        "early": len(v.early),
        "duplicates": len(v.duplicates),
        "stale_fence_accepted": len(v.stale_fence_accepted),
        "missed_without_reason": len(v.missed_without_reason),
        "max_late_s": round(v.max_late_s, 3),
        "late_p99_s": round(v.late_p99_s, 3),
        "unknown": len(v.unknown),
        "unknown_with_effect": v.unknown_with_effect,
        "at_most_once_redispatched": len(v.at_most_once_redispatched),
        "success_with_refused_effect": len(v.success_with_refused_effect),
        "dead_lettered": v.dead_lettered,
        "missed": v.missed,
        "effects_repeated": v.effects_repeated,
    }


def history(
    fires: Iterable[Fire],
    runs: Sequence[Run],
    missed: Sequence[Missed],
    effects: Sequence[Mapping[str, Any]],
    writes: Sequence[ResourceWrite],
) -> list[dict[str, Any]]:
    """Everything recorded about each fire: its executions, missed record,
    effect lines and resource writes (what a failure prints)."""
    wanted = set(fires)
    out = []
    for fire in sorted(wanted):
        key = f"{fire[0]}:{fire[1]}"
        out.append(
            {
                "job": fire[0],
                "scheduled_for": fire[1],
                "executions": [
                    {
                        "run": r.run_id,
                        "attempt": r.attempt,
                        "state": r.state,
                        "fence": r.fence,
                        "epoch": r.fence >> EPOCH_SHIFT,
                        "worker": r.worker_id,
                        "dispatched_at_ms": r.dispatched_at_ms,
                        "finished_at_ms": r.finished_at_ms,
                        "error": r.error,
                    }
                    for r in sorted(runs, key=lambda r: r.attempt)
                    if (r.job_id, r.scheduled_for) == fire
                ],
                "missed": [
                    {"reason": m.reason, "recorded_at_ms": m.recorded_at_ms}
                    for m in missed
                    if (m.job_id, m.scheduled_for) == fire
                ],
                "effects": [
                    dict(e) for e in effects if (int(e["job"]), int(e["scheduled_for"])) == fire
                ],
                "resource_writes": [
                    {"seq": w.seq, "fence": w.fence, "run": w.run_id, "accepted": w.accepted}
                    for w in writes
                    if w.key == key
                ],
            }
        )
    return out
