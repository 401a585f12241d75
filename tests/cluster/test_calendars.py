"""Calendars in a cluster: a calendar set through one member is known to a
submit through another, and a change made through a third reaches the
owner of the job's shard within the nodes' refresh (5 s)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from testkit.cluster import HANDLER, PAYLOAD, Cluster
from testkit.procs import wait_for
from wheel.client import MissedReason, RunState
from wheel.engine.model import shard_of

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def test_a_calendar_changed_through_one_member_re_arms_its_job_on_another(
    shared_cluster: Cluster,
) -> None:
    cluster = shared_cluster
    first, second, third = cluster.nodes[:3]
    today = datetime.now(UTC).date()
    first.client().set_calendar(
        "today", tenant="cal-cluster", ranges=[(today, today + timedelta(days=1))]
    )
    job = second.client().submit(
        name="every-second", handler=HANDLER, cron="* * * * * *", payload=PAYLOAD,
        tenant="cal-cluster", skip_calendars=["today"],
    )  # fmt: skip
    owner = cluster.ownership().holder_epochs()[shard_of(job.job_id)][0]
    client = second.client()

    def runs(state: RunState) -> list[datetime]:
        return [r.scheduled_for for r in client.runs(job.job_id) if r.state is state]

    wait_for(
        lambda: [r for r in client.runs(job.job_id) if r.missed_reason is MissedReason.CALENDAR],
        15,
        f"the day recorded missed by {owner}",
    )
    assert runs(RunState.SUCCEEDED) == []
    # Deleted through a member that may not own the job: its owner reads the
    # change within its refresh and fires again.
    assert third.client().delete_calendar("today", tenant="cal-cluster")
    wait_for(lambda: len(runs(RunState.SUCCEEDED)) >= 2, 20, "fires after the delete")
    second.client().cancel(job.job_id)
