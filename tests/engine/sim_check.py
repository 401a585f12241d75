"""The simulation's verdict: every promise of ``docs/design.md`` ("The
promise to users") over a ``Sim``'s whole recorded history.

``check(sim)`` judges it first by ``testkit.promises.check``, the judge the
nemesis uses too: the simulation's history becomes that function's inputs
(``_planned``: the fires each job owed and why one may be missed; the
reference store's executions and missed records; the handlers' effect log
and fenced writes, in simulated time). Then come the rules only a
simulation can see -- the store's log of every claim and completion, the
owner's state, each worker's messages -- each named in
``testkit.promises.RULES`` and judged here and nowhere else.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise

from testkit.promises import Missed, PlannedJob, Run, Verdict, Violation
from testkit.promises import check as check_promises
from tests.engine.sim import MIN, RETRIED_FROM, T0, Sim, overlap_limit
from tests.store.reference import ExecRow as _ExecRow
from wheel.engine.jobtable import NEVER
from wheel.engine.model import (
    JobState,
    MissedReason,
    RunState,
    idempotency_key,
    shard_of,
)
from wheel.engine.owner import Outcome
from wheel.engine.spec import CatchUpMode, Cron, JobSpec, Once, SideEffect

# What the store holds once a completion with each outcome was accepted (a
# hand-back writes nothing: the run goes to another worker as it is).
_OUTCOME_STATES = {
    Outcome.SUCCEEDED: {RunState.SUCCEEDED},
    Outcome.FAILED: {RunState.DEAD_LETTERED},
    Outcome.RETRYABLE: {RunState.FAILED, RunState.DEAD_LETTERED},
    Outcome.ABANDONED: {RunState.LOST, RunState.UNKNOWN, RunState.DEAD_LETTERED},
}


def check(sim: Sim) -> list[Violation]:
    """Every promise of docs/design.md "The promise to users" over the history,
    each violation named by its rule in ``testkit.promises.RULES`` (and so by
    the promise's number there).

    The history is judged first by ``testkit.promises.check``, the nemesis's
    judge too (``_promises_violations``), then by the rules only the
    simulation can see (the claim log, the owner, each worker's messages).

    Run after ``Sim.drain``: every fire due before the end (``sim.end``, when
    the drain began) must be settled -- run to success, dead-lettered or
    unknown, or recorded missed with a reason. A fire still in flight,
    waiting on a job or owed a retry after the drain would never have ended:
    a silent drop (``lost``). Fires that came due during the drain may still
    be on their way.
    """
    out: list[Violation] = []
    store, owner, end = sim.store, sim.owner, sim.end
    assert owner is not None, "check runs on a live node"
    assert sim.draining, "check runs after the drain"
    horizon = end

    execs_by_fire: dict[tuple[int, int], list[_ExecRow]] = defaultdict(list)
    for ex in store.execs.values():
        execs_by_fire[(ex.job_id, ex.scheduled_for)].append(ex)

    # Retries and re-dispatches of fires due during the drain may still wait.
    retry_pending = {(j, f, a) for j, f, a in owner.redos.waiting()}
    for job_id, held_job in owner.jobs.items():
        retry_pending.update((job_id, f, n) for f, n, _ in held_job.due if n > 0)
    retry_pending.update(owner.claims.keys())

    # 1. No silent drop, and missed with a reason: ``testkit.promises.check``
    # judges every fire the simulation owed (see ``_planned``).
    out.extend(_promises_violations(sim, execs_by_fire))

    # Liveness: an active fixed_delay job with fires left is armed, running
    # or queued (its next fire is not known before its last run ends, so no
    # plan can list it).
    for job in sim.jobs.values():
        c = job.compiled
        row = store.jobs[job.job_id]
        if row.state is JobState.ACTIVE and c.completion_driven and job.first_fire is not None:
            oj = owner.jobs.get(job.job_id)
            # A job at rest is armed if its row has a fire due (its FIRE
            # timer is in the wheel once that comes within the arming window).
            image = owner.image_of(job.job_id) if oj is None else None
            dormant_armed = image is not None and image.due != NEVER
            if not dormant_armed and (
                oj is None or (oj.next_fire is None and not oj.due and oj.inflight <= 0)
            ):
                last_finish = max(
                    (
                        ex.finished_at_ms or 0
                        for (j, _), exs in execs_by_fire.items()
                        if j == job.job_id
                        for ex in exs
                    ),
                    default=0,
                )
                out.append(
                    Violation(
                        "no silent drop",
                        f"fixed_delay job {job.job_id} is active but nothing is armed "
                        f"(last run finished at T0{last_finish - T0:+d} ms, pauses {job.pauses})",
                    )
                )

    # 2. Never early: handed out at the fire's (jittered) time or later,
    # claimed no earlier than the owner's claim lead before it.
    lead = sim.config.claim_ahead_ms
    for logged_at, _, claim, run_id in store.claims_log:
        if run_id is None:
            continue
        job = sim.jobs[claim.job_id]
        due = claim.scheduled_for
        if claim.attempt == 0 and claim.scheduled_for not in job.extra_fires:
            due = job.compiled.jittered(claim.scheduled_for)
        if claim.dispatched_at_ms < due or logged_at < due - lead:
            out.append(
                Violation(
                    "never early",
                    f"job {claim.job_id} fire {claim.scheduled_for} attempt {claim.attempt} "
                    f"claimed at {logged_at} for {claim.dispatched_at_ms}, due {due}",
                )
            )
    for t, _, a in sim.history.dispatches:
        if t < a.scheduled_for:
            out.append(
                Violation("never early", f"run {a.run_id} handed out at {t} < {a.scheduled_for}")
            )

    # 3. Per-job serialization: runs held by workers at once <= the overlap
    # limit, each from its first hand-out until the store applied its terminal
    # state. (A run claimed ahead -- a trigger, a backfill -- is an execution
    # row from its claim on, but runs nowhere until it is handed out.)
    handed: dict[int, int] = {}
    for t, _, a in sim.history.dispatches:
        handed.setdefault(a.run_id, t)
    points: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for ex in store.execs.values():
        start = handed.get(ex.run_id)
        if start is None:
            continue
        stop = ex.finished_at_ms if ex.finished_at_ms is not None else end + 1
        points[ex.job_id].append((start, 1, ex.run_id))
        points[ex.job_id].append((stop, -1, ex.run_id))
    for job_id, pts in points.items():
        limit = overlap_limit(sim.jobs[job_id].spec)
        live, live_ids = 0, set()
        for t, d, run_id in sorted(pts, key=lambda p: (p[0], p[1])):
            live += d
            if d > 0:
                live_ids.add(run_id)
            else:
                live_ids.discard(run_id)
            if live > limit:
                out.append(
                    Violation(
                        "per-job serialization",
                        f"job {job_id} ({_describe(sim.jobs[job_id].spec)}): "
                        f"{live} runs in flight at "
                        f"{t} (limit {limit}): {sorted(live_ids)}",
                    )
                )
                break

    # 4. Fences: per shard strictly increasing in claim order; a completion
    # applied in the store carries the newest fence of its fire.
    last_fence: dict[int, int] = {}
    claimed_at: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for _, seq, claim, run_id in store.claims_log:
        shard = shard_of(claim.job_id)
        if claim.fence <= last_fence.get(shard, -1):
            out.append(
                Violation(
                    "fences increase",
                    f"shard {shard}: fence {claim.fence} after {last_fence[shard]}",
                )
            )
        last_fence[shard] = claim.fence
        if run_id is not None:
            claimed_at[(claim.job_id, claim.scheduled_for)].append((seq, claim.fence))
    applied_by_run = {ap.run_id: ap for ap in store.applied}
    for ap in store.applied:
        ex = store.execs[ap.run_id]
        newer = [
            fence
            for seq, fence in claimed_at[(ex.job_id, ex.scheduled_for)]
            if seq < ap.seq and fence > ap.fence
        ]
        if newer:
            out.append(
                Violation(
                    "no stale fence",
                    f"run {ap.run_id} completed with fence {ap.fence}; newer {newer}",
                )
            )
    received = {
        (t, wid, run_id): (fence, outcome)
        for t, wid, run_id, fence, outcome in sim.history.received_completions
    }
    for t, wid, res in sim.history.results:
        if (t, wid, res.run_id) not in received:
            continue
        fence, outcome = received[(t, wid, res.run_id)]
        applied = applied_by_run.get(res.run_id)
        if outcome is Outcome.HANDED_BACK:
            continue  # the run went back to the queue: nothing in the store
        if res.accepted:
            ok = (
                applied is not None
                and applied.at_ms == t
                and applied.fence == fence
                and applied.state in _OUTCOME_STATES[outcome]
            )
            if not ok:
                out.append(
                    Violation(
                        "no stale fence",
                        f"worker {wid}'s completion of run {res.run_id} (fence {fence}) "
                        "was accepted "
                        f"but the store holds {applied}",
                    )
                )
        else:
            exec_row = store.execs.get(res.run_id)
            if (
                exec_row is not None
                and exec_row.fence == fence
                and exec_row.worker_id in (None, wid)
                and applied is not None
                and applied.at_ms >= t
                and applied.state in (RunState.LOST, RunState.UNKNOWN, RunState.DEAD_LETTERED)
                and (
                    applied.state is not RunState.DEAD_LETTERED or "lease" in (exec_row.error or "")
                )
                and max(fc for _, fc in claimed_at[(exec_row.job_id, exec_row.scheduled_for)])
                == fence
            ):
                out.append(
                    Violation(
                        "valid completion accepted",
                        f"worker {wid} completed run {res.run_id} (fence {fence}, the newest, "
                        f"not terminal) at {t}: rejected ({res.reason}); "
                        f"later ended {applied.state}",
                    )
                )

    # 5. Retries: contiguous attempts, stop at max_attempts, never dropped;
    # at_most_once never re-dispatched once its outcome is unknown.
    for (job_id, f), exs in execs_by_fire.items():
        job = sim.jobs[job_id]
        spec = job.spec
        exs.sort(key=lambda e: e.attempt)
        attempts = [e.attempt for e in exs]
        if attempts != list(range(len(exs))):
            out.append(Violation("retries", f"job {job_id} fire {f}: attempts {attempts}"))
            continue
        if len(exs) > spec.retry.max_attempts:
            out.append(
                Violation(
                    "retries stop",
                    f"job {job_id} fire {f}: {len(exs)} attempts > "
                    f"max {spec.retry.max_attempts}: "
                    f"{[(e.state.value, e.error) for e in exs]}",
                )
            )
        # A hand-back uses no attempt: a fire whose handler kept failing
        # (retryable) is dead-lettered only after all of its attempts.
        if (
            exs[-1].state is RunState.DEAD_LETTERED
            and exs[-1].error == "sim retryable"
            and len(exs) < spec.retry.max_attempts
        ):
            out.append(
                Violation(
                    "retries use every attempt",
                    f"job {job_id} fire {f}: dead-lettered after {len(exs)} of "
                    f"{spec.retry.max_attempts} attempts: "
                    f"{[(e.state.value, e.error) for e in exs]}",
                )
            )
        for prev, nxt in pairwise(exs):
            if prev.state not in RETRIED_FROM:
                out.append(
                    Violation(
                        "retries",
                        f"job {job_id} fire {f}: attempt {nxt.attempt} after {prev.state}",
                    )
                )
            # (After a lost or unknown one it is ``check``'s
            # at_most_once_redispatched.)
            if spec.side_effect is SideEffect.AT_MOST_ONCE and prev.state not in (
                RunState.FAILED,
                RunState.LOST,
                RunState.UNKNOWN,
            ):
                out.append(
                    Violation(
                        "at_most_once",
                        f"job {job_id} fire {f}: attempt {nxt.attempt} re-dispatched after "
                        f"{prev.state} ({prev.error}): the first may have run",
                    )
                )
        last = exs[-1]
        if last.state in RETRIED_FROM:
            if store.jobs[job_id].state is JobState.CANCELLED:
                continue
            if f < horizon:
                pass  # a fire owed by the end: ``check`` finds it lost
            elif (job_id, f, last.attempt + 1) in retry_pending:
                continue
            else:
                out.append(
                    Violation(
                        "retries continue",
                        f"job {job_id} fire {f}: attempt {last.attempt} ended {last.state} "
                        f"({last.error}) at {last.finished_at_ms}; no further attempt, "
                        "none pending",
                    )
                )
        if spec.side_effect is SideEffect.AT_MOST_ONCE and last.state is RunState.LOST:
            out.append(
                Violation(
                    "at_most_once", f"job {job_id} fire {f}: at_most_once run lost, not unknown"
                )
            )

    # Routing: a run goes only to a worker that registered its handler.
    for t, wid, a in sim.history.misrouted:
        out.append(
            Violation("routing", f"run {a.run_id} of handler {a.handler!r} went to {wid} at {t}")
        )

    # 6. Idempotency keys: derived from the fire only, equal across attempts.
    keys: dict[tuple[int, int], set[str]] = defaultdict(set)
    for _, _, a in sim.history.dispatches:
        keys[(a.job_id, a.scheduled_for)].add(a.idempotency_key)
        exec_row = store.execs.get(a.run_id)
        if exec_row is None or exec_row.fence != a.fence or exec_row.attempt != a.attempt:
            out.append(
                Violation(
                    "fenced assignment", f"assignment {a} does not match the store's {exec_row}"
                )
            )
    for (job_id, f), ks in keys.items():
        if ks != {idempotency_key(job_id, f)}:
            out.append(Violation("stable idempotency key", f"job {job_id} fire {f}: keys {ks}"))

    # Schedules only move forward.
    for move in store.moves:
        if move.old is not None and move.new is not None and move.new < move.old:
            out.append(Violation("schedule moves forward", f"{move}"))
    return out


def _promises_violations(
    sim: Sim, execs_by_fire: dict[tuple[int, int], list[_ExecRow]]
) -> list[Violation]:
    """The simulation's history judged by ``testkit.promises.check``, the
    nemesis's judge: the fires the simulation owed, the reference store's
    executions and missed records, the handlers' effect log and writes."""
    store = sim.store
    runs = [
        Run(
            run_id=ex.run_id,
            job_id=ex.job_id,
            scheduled_for=ex.scheduled_for,
            attempt=ex.attempt,
            state=ex.state.value,
            fence=ex.fence,
            worker_id=ex.worker_id,
            dispatched_at_ms=ex.dispatched_at_ms,
            finished_at_ms=ex.finished_at_ms,
            error=ex.error,
        )
        for ex in store.execs.values()
    ]
    # A trigger's fire shares its key with the schedule's fire at that
    # instant: the schedule's may be recorded missed while the trigger's
    # ran. Those records say nothing about the fire, which ran.
    missed = [
        Missed(
            job_id=m.job_id,
            scheduled_for=m.scheduled_for,
            reason=m.reason.value,
            recorded_at_ms=m.recorded_at_ms,
        )
        for (job_id, f), m in store.missed.items()
        if not ((job_id, f) in execs_by_fire and f in sim.jobs[job_id].extra_fires)
    ]
    verdict = check_promises(
        _planned(sim, execs_by_fire),
        runs,
        missed,
        sim.history.effects,
        sim.history.writes,
        end_ms=sim.end,
        overlap_tolerance_ms=0,  # one clock
    )
    return _verdict_violations(sim, verdict, execs_by_fire)


def _planned(sim: Sim, execs_by_fire: dict[tuple[int, int], list[_ExecRow]]) -> list[PlannedJob]:
    """Each job's plan as ``check`` reads it: the fires it owed by the end
    (``sim.end``, when the drain began) and why one may be recorded missed.

    Owed: every nominal fire (jittered) before the end of its life (the
    end, its cancellation, or a pause never resumed); its triggers and
    backfills; each DST-gap instant its schedule passed under ``skip`` that
    no fire shares (recorded missed as ``dst_gap``); and every fire due
    before the end that the store or the owner holds (a fixed_delay job's
    fires after its first, known only as runs end). A cancelled job owes
    nothing more of a fire whose run the cancellation ended or whose retry
    it stopped."""
    store, owner, horizon = sim.store, sim.owner, sim.end
    assert owner is not None
    held: dict[int, set[int]] = defaultdict(set)
    for job_id, f in execs_by_fire:
        if f < horizon:
            held[job_id].add(f)
    for job_id, held_job in owner.jobs.items():
        held[job_id].update(d[0] for d in held_job.due if d[0] < horizon)
        held[job_id].update(f for f in held_job.buffered if f < horizon)
    missed_fires: dict[int, list[int]] = defaultdict(list)
    for job_id, f in store.missed:
        missed_fires[job_id].append(f)
    plans = []
    for job in sim.jobs.values():
        spec, c = job.spec, job.compiled
        fires: set[int] = set(job.extra_fires) | held[job.job_id]
        life_end = horizon
        if job.cancelled_at is not None:
            life_end = min(life_end, job.cancelled_at)
        if job.pauses and job.pauses[-1][1] is None:
            life_end = min(life_end, job.pauses[-1][0])
        if job.first_fire is not None:
            if c.completion_driven:
                if c.jittered(job.first_fire) < life_end:
                    fires.add(job.first_fire)
            else:
                nominal: int | None = job.first_fire
                while nominal is not None and c.jittered(nominal) < life_end:
                    fires.add(nominal)
                    nominal = c.next_fire(nominal)
            # DST gaps under skip: each transition instant that had skipped
            # wall times and no real fire is recorded missed once the
            # schedule passed it: at the fire before it, or from the job's
            # submission or resume when it comes before the next fire.
            for skip in c.skipped_between(job.submitted_at, life_end):
                s = skip.at_ms
                if c.next_fire(s - 1) == s:
                    continue
                before = c.fires_between(job.first_fire - 1, s - 1, 10_000)
                if before and c.jittered(before[-1]) >= life_end:
                    continue
                fires.add(s)
        if store.jobs[job.job_id].state is JobState.CANCELLED:
            for f in list(fires):
                exs = execs_by_fire.get((job.job_id, f))
                if exs:
                    last = max(exs, key=lambda e: e.attempt).state
                    if last is RunState.CANCELLED or last in RETRIED_FROM:
                        fires.discard(f)
        reasons = {MissedReason.OVERLAP}  # every overlap policy can skip a fire
        if job.pauses:
            reasons.add(MissedReason.PAUSED)
        mode = spec.catch_up.mode
        reasons.add(
            {
                CatchUpMode.SKIP: MissedReason.SKIPPED,
                CatchUpMode.RUN_LATEST_ONLY: MissedReason.COLLAPSED,
                CatchUpMode.RUN_ALL: MissedReason.OVER_CAP,
            }[mode]
        )
        if spec.catch_up.window_ms is not None and mode is not CatchUpMode.SKIP:
            reasons.add(MissedReason.OUTSIDE_WINDOW)
        gaps = frozenset(
            f
            for f in missed_fires[job.job_id]
            if c.skipped_between(f - 1, f, 1) and c.next_fire(f - 1) != f
        )
        plans.append(
            PlannedJob(
                job_id=job.job_id,
                kind="listed",
                at_most_once=spec.side_effect is SideEffect.AT_MOST_ONCE,
                fires=tuple(sorted(fires)),
                missed_reasons=frozenset(r.value for r in reasons),
                cancelled_at_ms=job.cancelled_at,
                dst_gaps=gaps,
            )
        )
    return plans


def _verdict_violations(
    sim: Sim, verdict: Verdict, execs_by_fire: dict[tuple[int, int], list[_ExecRow]]
) -> list[Violation]:
    """One ``Violation`` per item of each count ``check`` requires to be
    zero, named by that count's rule, with what the simulation knows of it."""
    owner = sim.owner
    assert owner is not None
    out = []
    for rule in verdict.violations():
        items: list[object] = getattr(verdict, rule)
        for item in items:
            if isinstance(item, dict):
                job_id, f = int(item["job"]), int(item["scheduled_for"])
                said = {k: v for k, v in item.items() if k not in ("job", "scheduled_for")}
            else:
                assert isinstance(item, tuple)
                job_id, f = item
                said = {}
            exs = sorted(execs_by_fire.get((job_id, f), ()), key=lambda e: e.attempt)
            held = owner.jobs.get(job_id)
            missed = sim.store.missed.get((job_id, f))
            out.append(
                Violation(
                    rule,
                    f"job {job_id} ({_describe(sim.jobs[job_id].spec)}) fire {f} "
                    f"(T0{f - T0:+d} ms){f' {said}' if said else ''}: attempts "
                    f"{[(e.attempt, e.state.value, e.error) for e in exs]}, missed "
                    f"{None if missed is None else missed.reason.value}, "
                    f"{sim.history.drain_ms // MIN} min after the end the owner holds "
                    + (
                        "nothing"
                        if held is None
                        else f"due={list(held.due)} buffered={list(held.buffered)} "
                        f"paused={held.paused} inflight={held.inflight}"
                    ),
                )
            )
    return out


def _describe(spec: JobSpec) -> str:
    s = spec.schedule
    if isinstance(s, Once):
        sched = "once"
    elif isinstance(s, Cron):
        sched = f"cron {s.expr!r} {s.time_zone}"
    else:
        sched = f"{s.mode.value} {s.period_ms // 1000}s"
    return (
        f"{sched}, overlap {spec.overlap.policy.value}, catch-up {spec.catch_up.mode.value}, "
        f"{spec.side_effect.value}, jitter {spec.jitter_ms}, retry {spec.retry.max_attempts}"
    )
