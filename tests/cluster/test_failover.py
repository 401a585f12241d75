"""A node dies under load (SIGKILL) or stops past its lease (SIGSTOP, then
SIGCONT): its shards move, every fire still runs, and nothing its old epochs
carry is created once another owner holds the shard (only completions of
its runs still in flight are accepted then, under those runs' fences)."""

from __future__ import annotations

import json
import signal
import time

import pytest

from testkit.cluster import (
    HANDLER,
    SAFETY_MARGIN_S,
    TTL_S,
    Cluster,
    ClusterNode,
    Execution,
    Load,
    Submitted,
    Truth,
    epoch_of,
    now_ms,
    utc,
    wait_every_fire_resolved,
)
from testkit.e2e_handlers import events
from testkit.procs import wait_for
from wheel.client import JobRequest
from wheel.engine.model import shard_of

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.etcd]


def _of_epochs(runs: list[Execution], epochs: dict[int, int]) -> dict[int, Execution]:
    """The runs issued under the given (shard -> epoch) holds, by run id."""
    return {e.run_id: e for e in runs if epochs.get(e.shard) == e.epoch}


def _succeeded(runs: dict[int, Execution]) -> set[int]:
    return {run_id for run_id, e in runs.items() if e.state == "succeeded"}


@pytest.mark.timed
def test_a_killed_node_s_shards_move_within_ttl_and_every_fire_still_runs_once(
    cluster: Cluster,
) -> None:
    victim = cluster.nodes[2]
    survivors = cluster.nodes[:2]
    truth = cluster.truth
    load = Load(targets=lambda: [n.target for n in survivors], rate=20, intervals=20)
    load.start()
    try:
        # Under load: the victim has dispatched and finished runs of its own.
        before = cluster.ownership()
        held = before.held[victim.node_id]
        wait_for(
            lambda: len(_succeeded(_of_epochs(truth.executions(), held))) >= 20,
            20,
            "the victim to run its share of the load",
            0.3,
        )
        killed, killed_ms = time.monotonic(), now_ms()
        victim.kill()
        cluster.wait_whole(live=survivors, timeout=TTL_S + 10)
        moved_s = time.monotonic() - killed
        took_over_ms = now_ms()
        at_takeover = _of_epochs(truth.executions(held), held)
        print(f"shards moved {moved_s:.2f} s after the SIGKILL (ttl {TTL_S} s)")
        assert moved_s <= TTL_S + 1, f"shards moved after {moved_s:.2f} s"
        # Their views of one another follow within a reconcile (ttl/3).
        own = cluster.wait_settled(live=survivors, timeout=TTL_S)

        # Only the victim's shards moved, each to a survivor under a newer epoch.
        now = own.holder_epochs()
        for shard, (node, epoch) in before.holder_epochs().items():
            if shard in held:
                assert node == victim.node_id
                assert now[shard][0] != victim.node_id and now[shard][1] > epoch
            else:
                assert now[shard] == (node, epoch)

        # The new owners run the moved shards' fires under their own epochs.
        new = {s: now[s][1] for s in held}
        wait_for(
            lambda: len(_succeeded(_of_epochs(truth.executions(held), new))) >= 20,
            15,
            "the moved shards' fires to run on their new owners",
            0.3,
        )
    finally:
        end_ms = load.stop()
    jobs = load.snapshot()
    # One-shots went in on both sides of the kill: some due before it, some
    # sent after it (due a lead after they were sent), so the moved shards
    # were owed new work as well as their recurring fires. (A count alone
    # depended on how fast the run went: a quick takeover left exactly 100.)
    once = [j.first_ms for j in jobs if j.period_ms == 0]
    assert any(at < killed_ms for at in once)
    assert any(at > killed_ms + round(load.lead_s * 1000) for at in once)
    wait_every_fire_resolved(truth, jobs, end_ms, timeout=30)
    assert truth.double_successes() == []
    assert truth.missed_and_run() == []
    # Nothing of the dead node's epochs was created after the takeover.
    after = _of_epochs(truth.executions(held), held)
    late = {r: e for r, e in after.items() if r not in at_takeover}
    epochs = truth.shard_epochs()
    assert not late, (
        f"created after the takeover (killed at {killed_ms}, held at {took_over_ms}): "
        + "; ".join(f"{e} stored epoch {epochs.get(e.shard)}" for e in late.values())
    )
    assert set(after) == set(at_takeover)
    # What it ran to the end stays so. A run of its epochs still running at
    # the kill may end after the takeover: its worker re-sends the completion
    # no node confirmed to the shard's new owner, which accepts it under the
    # run's own fence (and no fire succeeded twice, above).
    assert _succeeded(at_takeover) <= _succeeded(after)
    ended_later = _succeeded(after) - _succeeded(at_takeover)
    assert {at_takeover[r].state for r in ended_later} <= {"dispatched", "running"}


def test_a_node_stopped_past_its_ttl_goes_quiet_rejoins_with_new_epochs_and_is_fenced_out(
    cluster: Cluster,
) -> None:
    victim = cluster.nodes[2]
    others = cluster.nodes[:2]
    truth = cluster.truth
    load = Load(targets=lambda: [n.target for n in others], rate=20, intervals=20)
    load.start()
    try:
        before = cluster.ownership()
        held = before.held[victim.node_id]
        wait_for(
            lambda: len(_succeeded(_of_epochs(truth.executions(), held))) >= 20,
            20,
            "the victim to run its share of the load",
            0.3,
        )
        # Writes on their way when it stops: its link to the store is held
        # first, then runs of its shards end and their workers report them.
        # It takes every completion in (it holds no run any more) but cannot
        # write them, nor the claims it made meanwhile.
        slow = _slow_runs_on(cluster, victim.node_id, held)
        link = cluster.links[victim.node_id]
        link.hold()
        wait_for(
            lambda: _ended(cluster, slow) and _holds_nothing(victim),
            10,
            "the victim to take in the slow runs' completions",
        )
        stopped_ms = now_ms()
        victim.signal(signal.SIGSTOP)
        # Its local deadline: the last keepalive went out before the stop.
        deadline_ms = stopped_ms + round((TTL_S - SAFETY_MARGIN_S) * 1000)
        try:
            cluster.wait_whole(live=others, timeout=TTL_S + 10)
            at_takeover = _of_epochs(truth.executions(held), held)
            own = cluster.wait_settled(live=others, timeout=TTL_S)
            interim = {s: own.holder_epochs()[s] for s in held}
            assert all(node != victim.node_id for node, _ in interim.values())
        finally:
            # Its writes reach the store after the takeover, then it wakes.
            link.release()
            victim.signal(signal.SIGCONT)
        # Stopped past its deadline (the takeover waited for etcd's expiry).
        assert now_ms() > deadline_ms

        # It rejoins: the same shards (same node id) under epochs newer than
        # both its own old ones and the interim owners'.
        own = cluster.wait_settled(
            live=cluster.nodes, timeout=TTL_S + 10, holding={victim.node_id: held}
        )
        rejoined = own.held[victim.node_id]
        assert set(rejoined) == set(held)
        for shard, epoch in rejoined.items():
            assert epoch > interim[shard][1] > held[shard]
        wait_for(
            lambda: len(_succeeded(_of_epochs(truth.executions(held), rejoined))) >= 10,
            15,
            "the rejoined node to run fires under its new epochs",
            0.3,
        )
    finally:
        end_ms = load.stop()
    jobs = load.snapshot() + slow
    wait_every_fire_resolved(truth, jobs, end_ms, timeout=30)
    assert truth.double_successes() == []

    old = _of_epochs(truth.executions(held), held)
    # Quiet past its deadline: nothing claimed under its old epochs after it.
    late = [e for e in old.values() if e.dispatched_at_ms > deadline_ms]
    assert late == [], f"dispatched after the local deadline {deadline_ms}: {late[:5]}"
    # Its buffered writes were refused: no run of its old epochs was created,
    # and no success of one it took in before it stopped was accepted once
    # another owner held the shard. (A worker whose completion it never
    # answered reports the run again to the shard's new owner, which adopted
    # it: that success is the new owner's write, made after the stop.)
    created = [old[r] for r in sorted(set(old) - set(at_takeover))]
    accepted = [
        old[r]
        for r in sorted(_succeeded(old) - _succeeded(at_takeover))
        if (old[r].finished_at_ms or 0) <= stopped_ms
    ]
    assert (created, accepted) == ([], []), (
        f"{len(created)} runs of its old epochs created and {len(accepted)} successes of"
        f" them accepted after the takeover; {_with_fire(truth, created + accepted)}"
    )
    # And so no fire was both recorded missed by the interim owner and run.
    assert truth.missed_and_run() == []
    # The slow runs were superseded or re-run: each fire succeeded once, under
    # a fence no older than the takeover's.
    for job in slow:
        won = [e for e in truth.executions() if e.job_id == job.job_id and e.state == "succeeded"]
        assert len(won) == 1, won
        by_victim = (won[0].finished_at_ms or 0) <= stopped_ms
        assert (
            won[0].run_id not in old or won[0].run_id in _succeeded(at_takeover) or not by_victim
        ), won


def _with_fire(truth: Truth, runs: list[Execution]) -> str:
    """The runs, each with every execution and missed record of its fire."""
    fires = {(e.job_id, e.scheduled_for) for e in runs}
    everything = [e for e in truth.executions() if (e.job_id, e.scheduled_for) in fires]
    missed = truth.missed() & fires
    lines = [f"  {e}" for e in sorted(everything, key=lambda e: (e.job_id, e.run_id))]
    return "\n".join(["runs of their fires:", *lines, f"missed: {sorted(missed)}"])


def _ended(cluster: Cluster, jobs: list[Submitted]) -> bool:
    ids = {j.job_id for j in jobs}
    return {ev["job"] for ev in events(cluster.out) if ev["event"] == "end"} >= ids


def _holds_nothing(node: ClusterNode) -> bool:
    status = node.status()
    return status is not None and all(w.held == 0 for w in status.worker_list)


def _slow_runs_on(cluster: Cluster, node_id: str, held: dict[int, int]) -> list[Submitted]:
    """Submit one-shots that sleep 1.5 s, due now, and wait until the ones of
    ``node_id``'s shards have started under its epochs; their job ids."""
    entry = next(n for n in cluster.nodes if n.node_id != node_id)
    at = now_ms() + 500
    results = entry.client().submit_many(
        [
            JobRequest(
                name=f"slow-{i}",
                handler=HANDLER,
                at=utc(at),
                payload=json.dumps({"sleep_s": 1.5}).encode(),
            )
            for i in range(30)
        ]
    )
    ids = [r.job_id for r in results if not isinstance(r, Exception)]
    mine = {j for j in ids if shard_of(j) in held}
    assert mine

    def started() -> bool:
        seen = {
            ev["job"]
            for ev in events(cluster.out)
            if ev["event"] == "start"
            and ev["job"] in mine
            and held.get(shard_of(ev["job"])) == epoch_of(ev["fence"])
        }
        return seen == mine

    wait_for(started, 10, "the slow runs to start on the victim")
    return [Submitted(job_id=j, first_ms=at, period_ms=0) for j in sorted(mine)]
