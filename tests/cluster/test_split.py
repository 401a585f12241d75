"""Three nodes share the 256 shards, a job fires on its shard's owner
whichever node it was submitted through, and ``wheelctl status --shards``
shows who holds which under what epoch. The tests share one cluster: none
disturbs it, and each judges only its own jobs."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime

import psycopg
import pytest

from testkit.cluster import HANDLER, PAYLOAD, Cluster, Execution, now_ms, utc
from testkit.e2e_handlers import events
from testkit.procs import wait_for
from wheel import outbox
from wheel.cli import main
from wheel.client import JobRequest
from wheel.engine.model import SHARD_COUNT, shard_of

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.etcd]

JOBS = 1_000


def test_three_nodes_split_the_shards_disjointly_and_agree_on_it(shared_cluster: Cluster) -> None:
    cluster = shared_cluster
    own = cluster.ownership()
    ids = {n.node_id for n in cluster.nodes}
    assert own.settled_on(ids), own
    assert own.disjoint_and_whole()
    # Every node names all three members and the same owner for every shard.
    views = list(own.views.values())
    assert all(view == views[0] for view in views)
    assert set(views[0]) == set(range(SHARD_COUNT))
    # Each holds a share, none all or nothing (rendezvous: about a third each).
    shares = Counter(views[0].values())
    assert set(shares) == ids and all(40 <= n <= 130 for n in shares.values()), shares
    # The store was fenced by the same owners at the same epochs.
    fenced = cluster.truth.shard_epochs()
    assert {s: (node, epoch) for s, (epoch, node) in fenced.items()} == own.holder_epochs()


def test_a_thousand_jobs_submitted_through_one_node_each_fire_once_on_their_owner(
    shared_cluster: Cluster,
) -> None:
    cluster = shared_cluster
    own = cluster.ownership()
    holders = own.holder_epochs()  # shard -> (node, epoch)
    entry = cluster.nodes[0]
    at = now_ms() + 2_000
    requests = [
        JobRequest(
            name=f"once-{i}",
            handler=HANDLER,
            # Spread over a second: the three owners fire theirs side by side.
            at=utc(at + i % 1000),
            payload=PAYLOAD,
        )
        for i in range(JOBS)
    ]
    results = entry.client().submit_many(requests)
    job_ids = [r.job_id for r in results if not isinstance(r, Exception)]
    assert len(job_ids) == JOBS, [r for r in results if isinstance(r, Exception)][:3]
    ours = set(job_ids)
    # Most jobs belong to shards the entry node does not own.
    foreign = [j for j in job_ids if holders[shard_of(j)][0] != entry.node_id]
    assert len(foreign) > JOBS // 2

    truth = cluster.truth

    def our_runs() -> list[Execution]:
        return [e for e in truth.executions() if e.job_id in ours]

    wait_for(
        lambda: sum(e.state == "succeeded" for e in our_runs()) >= JOBS,
        30,
        f"{JOBS} succeeded runs",
        0.5,
    )
    runs = our_runs()
    by_job: dict[int, list[tuple[int, str, int]]] = {}
    for e in runs:
        by_job.setdefault(e.job_id, []).append((e.attempt, e.state, e.fence))
    assert set(by_job) == ours
    once = [j for j, rs in by_job.items() if len(rs) == 1 and rs[0][:2] == (1, "succeeded")]
    assert len(once) == JOBS, {j: rs for j, rs in by_job.items() if j not in set(once)}

    # Fired on the owner: each run's fence carries the epoch its shard's
    # owner holds it under, and no other node holds that epoch of that shard.
    fired_by: Counter[str] = Counter()
    for e in runs:
        node, epoch = holders[e.shard]
        assert e.epoch == epoch, (e, node, epoch)
        fired_by[node] += 1
    expected = Counter(holders[shard_of(j)][0] for j in job_ids)
    assert fired_by == expected
    assert len(fired_by) == 3

    # The workers ran each fire exactly once, with the fence the owner issued.
    wait_for(lambda: len(_ends(cluster, ours)) >= JOBS, 10, "the handlers' end events")
    ends = _ends(cluster, ours)
    assert Counter(j for j, _ in ends) == Counter(job_ids)
    assert {(j, f) for j, f in ends} == {(e.job_id, e.fence) for e in runs}

    # Ownership did not move meanwhile: the holders are those we judged by.
    assert cluster.ownership().holder_epochs() == holders


def test_outbox_rows_are_relayed_by_the_holder_of_shard_0_alone_and_fire_once_on_their_owners(
    shared_cluster: Cluster,
) -> None:
    """Every member runs a relay on the store's own outbox; only the holder of
    shard 0 claims rows, and the jobs of the other members' shards are armed
    by their owners (told at once) and fire there."""
    cluster = shared_cluster
    holders = cluster.ownership().holder_epochs()
    relayer = holders[0][0]
    rows = 300
    at = now_ms() + 2_000
    with psycopg.connect(cluster.dsn) as conn:
        entries = outbox.submit_many(
            conn,
            [
                JobRequest(name=f"outbox-{i}", handler=HANDLER, at=utc(at + i), payload=PAYLOAD)
                for i in range(rows)
            ],
        )
        conn.commit()
        ids = [e.id for e in entries]

        def fates() -> list[tuple[str, int, str]] | None:
            got = conn.execute(
                "SELECT state, job_id, relayed_by FROM wheel_outbox WHERE id = ANY(%s)"
                " AND state <> 'pending'",
                (ids,),
            ).fetchall()
            conn.commit()
            return got if len(got) == rows else None

        settled = wait_for(fates, 20, "every row's fate", 0.2)
    assert {(state, node) for state, _, node in settled} == {("done", relayer)}
    ours = {job_id for _, job_id, _ in settled}
    assert len(ours) == rows
    assert sum(holders[shard_of(j)][0] != relayer for j in ours) > rows // 3
    truth = cluster.truth

    def succeeded() -> list[Execution] | None:
        runs = [e for e in truth.executions() if e.job_id in ours]
        return runs if sum(e.state == "succeeded" for e in runs) >= rows else None

    runs = wait_for(succeeded, 30, f"{rows} succeeded runs", 0.5)
    assert sorted(e.job_id for e in runs) == sorted(ours)  # once each
    assert all(e.epoch == holders[e.shard][1] for e in runs)  # on its owner


def test_wheelctl_status_shards_shows_every_shards_owner_and_its_epoch(
    shared_cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = shared_cluster
    holders = cluster.ownership().holder_epochs()  # shard -> (node, epoch)
    # The store was fenced by the same owners at the same epochs.
    fenced = cluster.truth.shard_epochs()
    assert {s: (node, epoch) for s, (epoch, node) in fenced.items()} == holders
    owned = Counter(node for node, _ in holders.values())
    # Asked of one node, which holds only a third of the shards itself: the
    # other members' epochs come from them.
    entry = cluster.nodes[1]

    assert main(["status", "--shards", "--target", entry.target]) == 0
    lines = capsys.readouterr().out.splitlines()
    summary = ", ".join(f"{node} owns {n}" for node, n in sorted(owned.items()))
    assert f"shards: {summary}; 0 without an owner" in lines
    header = lines.index("shard  owner   epoch  dispatching since")
    rows = [line.split() for line in lines[header + 1 :]]
    # A settled cluster: one row per shard, each dispatched by its owner, no notes.
    assert {int(shard): (owner, int(epoch)) for shard, owner, epoch, _ in rows} == holders
    assert len(rows) == SHARD_COUNT

    assert main(["status", "--shards", "--json", "--target", entry.target]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["node_id"] == entry.node_id and out["unanswered"] == []
    since = [datetime.fromisoformat(row.pop("dispatching_since")) for row in out["shards"]]
    assert out["shards"] == [
        {"shard": s, "owner": node, "epoch": epoch, "held_by": {node: epoch}}
        for s, (node, epoch) in sorted(holders.items())
    ]
    assert all(at <= datetime.now(UTC) for at in since)
    # The shards this node handed on lately, each with when it stopped.
    assert all(datetime.fromisoformat(r["at"]) <= datetime.now(UTC) for r in out["released"])
    assert {n["node_id"]: n["shards_owned"] for n in out["nodes"]} == owned


def _ends(cluster: Cluster, jobs: set[int]) -> list[tuple[int, int]]:
    return [
        (ev["job"], ev["fence"])
        for ev in events(cluster.out)
        if ev["event"] == "end" and ev["outcome"] == "succeeded" and ev["job"] in jobs
    ]


def test_a_cron_changed_through_a_non_owner_fires_each_schedule_once_around_the_change(
    shared_cluster: Cluster,
) -> None:
    """Every other second on even seconds, changed while it fires to odd
    seconds through a member that does not own the job: the store's history
    holds every even second up to the change and every odd second after it,
    each once, and nothing missed."""
    cluster = shared_cluster
    holders = cluster.ownership().holder_epochs()
    job = (
        cluster.nodes[0]
        .client()
        .submit(name="seconds", handler=HANDLER, payload=PAYLOAD, cron="*/2 * * * * *")
    )
    owner = holders[shard_of(job.job_id)][0]
    entry = next(n for n in cluster.nodes if n.node_id != owner)
    truth = cluster.truth

    def fires() -> list[Execution]:
        return sorted(
            (e for e in truth.executions() if e.job_id == job.job_id), key=lambda e: e.scheduled_for
        )

    wait_for(lambda: sum(e.state == "succeeded" for e in fires()) >= 3, 20, "three fires", 0.1)
    client = entry.client()
    changed = client.update(job.job_id, cron="1-59/2 * * * * *", idempotency_key="to-odd")
    assert changed.job_id == job.job_id
    assert changed.next_fires and all(f.second % 2 == 1 for f in changed.next_fires)
    [change] = list(client.job_updates(job.job_id))
    at = int(change.updated_at.timestamp() * 1000)  # the owner's instant of the change
    wait_for(
        lambda: sum(e.scheduled_for > at and e.state == "succeeded" for e in fires()) >= 4,
        20,
        "four fires of the new schedule",
        0.1,
    )
    client.pause(job.job_id)
    wait_for(lambda: all(e.state == "succeeded" for e in fires()), 10, "the last run to end")
    runs = fires()
    sfs = [e.scheduled_for for e in runs]
    assert len(set(sfs)) == len(sfs), "a fire ran twice"
    assert all(e.attempt == 1 and e.state == "succeeded" for e in runs)
    old = [f for f in sfs if f <= at]
    new = [f for f in sfs if f > at]
    # Each schedule's every fire on its side of the change, none dropped.
    assert old == list(range(old[0], at + 1, 2_000))[: len(old)]
    assert old[-1] > at - 2_000
    assert new == list(range(new[0], new[-1] + 1, 2_000))
    assert all(f % 2_000 == 1_000 for f in new) and new[0] - at <= 2_000
    assert not any(j == job.job_id for j, _ in truth.missed())
    # Fired by the owner of its shard, before and after: one epoch.
    assert {e.epoch for e in runs} == {holders[shard_of(job.job_id)][1]}


def test_a_dead_letter_fixed_and_redriven_through_a_non_owner_runs_once_on_a_worker(
    shared_cluster: Cluster,
) -> None:
    """A run that fails for good, its job's payload fixed and its dead letter
    redriven through a member that does not own it: one new attempt, with a
    new fence from the owner, run once by a worker process, with the fixed
    payload."""
    cluster = shared_cluster
    holders = cluster.ownership().holder_epochs()
    entry = cluster.nodes[0].client()
    job = entry.submit(name="dead", handler=HANDLER, payload={"permanent": True}, cron="0 0 1 1 *")
    owner, epoch = holders[shard_of(job.job_id)]
    client = next(n for n in cluster.nodes if n.node_id != owner).client()
    client.trigger(job.job_id)
    [letter] = wait_for(lambda: client.dead_letters(job.job_id), 20, "the dead letter", 0.1)
    client.update(job.job_id, payload={"sleep_s": 0.05})
    [new] = client.redrive(job.job_id)
    assert (new.scheduled_for, new.attempt) == (letter.scheduled_for, letter.attempt + 1)
    assert new.fence > letter.fence and new.fence >> 32 == epoch
    assert client.redrive(job.job_id) == []  # redriven already: nothing more
    wait_for(
        lambda: any(r.state == "succeeded" for r in client.runs(job.job_id)), 20, "the run", 0.1
    )
    assert client.dead_letters(job.job_id) == []
    runs = [e for e in cluster.truth.executions() if e.job_id == job.job_id]
    assert sorted((e.attempt, e.state) for e in runs) == [
        (letter.attempt, "dead_lettered"),
        (new.attempt, "succeeded"),
    ]
    ends = [
        (e["attempt"], e["outcome"])
        for e in events(cluster.out)
        if e["job"] == job.job_id and e["event"] == "end"
    ]
    assert sorted(ends) == [(letter.attempt, "permanent"), (new.attempt, "succeeded")]
