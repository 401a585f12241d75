"""The Python scheduler wheel's users would otherwise pick: APScheduler 3's
BackgroundScheduler with its SQLAlchemyJobStore (a SQLite file or PostgreSQL).

Jobs are ordinary date and interval jobs with ``coalesce=False`` and
``misfire_grace_time=None`` (every fire runs however late: the at-least-once
configuration, so APScheduler is not credited for silently dropping fires).
The executor is the one plug point changed: instead of running the function
in a thread of the scheduler process, ``ForwardingExecutor`` hands each
(job, scheduled run time) to the K worker processes over the same loopback
dispatch queue the polling baseline uses, so every system's workers are
separate processes measured the same way. APScheduler's ``max_instances``
bookkeeping is not applied: the run's life belongs to the remote worker.

Submission writes the job store's own rows (id, next_run_time, pickled job
state, exactly as ``SQLAlchemyJobStore.add_job`` does) in one transaction
instead of one transaction per job: submission is not what is measured.
"""

from __future__ import annotations

import argparse
import pickle
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Dispatcher, Workload

TABLE = "wheel_bench_apscheduler_jobs"


def fire(job_index: int) -> None:
    """The job function the workers stand in for (referenced by name in the store)."""


def _engine(url: str) -> Any:
    from sqlalchemy import create_engine

    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return create_engine(url)


def _jobstore(url: str) -> Any:
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore

    return SQLAlchemyJobStore(engine=_engine(url), tablename=TABLE)


def submit(url: str, workload: Workload) -> None:
    """Create the job store table and write every job's row (not measured)."""
    from apscheduler.job import Job
    from apscheduler.schedulers.background import BackgroundScheduler
    from apscheduler.triggers.date import DateTrigger
    from apscheduler.triggers.interval import IntervalTrigger
    from apscheduler.util import datetime_to_utc_timestamp

    scheduler = BackgroundScheduler(timezone=UTC)
    store = _jobstore(url)
    store.start(scheduler, "default")  # creates the table
    rows = []
    for j in workload.jobs:
        first = datetime.fromtimestamp(j.first_ms / 1000, UTC)
        trigger: Any
        if j.period_ms:
            trigger = IntervalTrigger(seconds=j.period_ms / 1000, start_date=first, timezone=UTC)
        else:
            trigger = DateTrigger(run_date=first, timezone=UTC)
        job = Job(
            scheduler,
            id=str(j.index),
            func="apscheduler_baseline:fire",
            args=(j.index,),
            kwargs={},
            trigger=trigger,
            executor="default",
            name=f"bench-{j.index}",
            misfire_grace_time=None,
            coalesce=False,
            max_instances=1,
            next_run_time=first,
        )
        rows.append(
            {
                "id": job.id,
                "next_run_time": datetime_to_utc_timestamp(job.next_run_time),
                "job_state": pickle.dumps(job.__getstate__(), store.pickle_protocol),
            }
        )
    with store.engine.begin() as conn:
        for i in range(0, len(rows), 5000):
            conn.execute(store.jobs_t.insert(), rows[i : i + 5000])
    store.engine.dispose()


def _make_executor(dispatcher: Dispatcher) -> Any:
    from apscheduler.executors.base import BaseExecutor

    class ForwardingExecutor(BaseExecutor):  # type: ignore[misc]
        """Forwards each due (job, run time) to the worker processes."""

        def submit_job(self, job: Any, run_times: list[datetime]) -> None:
            self._do_submit_job(job, run_times)

        def _do_submit_job(self, job: Any, run_times: list[datetime]) -> None:
            jid = int(job.id)
            dispatcher.send([(0, jid, round(rt.timestamp() * 1000), 0) for rt in run_times])

    return ForwardingExecutor()


_stop = False


def _on_term(signum: int, frame: Any) -> None:
    global _stop
    _stop = True


def serve(url: str, workers: int) -> None:
    """The scheduler process: accept the workers, start APScheduler, run until SIGTERM."""
    from apscheduler.schedulers.background import BackgroundScheduler

    signal.signal(signal.SIGTERM, _on_term)
    dispatcher = Dispatcher(workers)
    print(f"PORT {dispatcher.port}", flush=True)
    dispatcher.accept_all()
    scheduler = BackgroundScheduler(
        timezone=UTC,
        jobstores={"default": _jobstore(url)},
        executors={"default": _make_executor(dispatcher)},
        job_defaults={"coalesce": False, "misfire_grace_time": None},
    )
    scheduler.start()
    print("READY", flush=True)
    while not _stop:
        time.sleep(0.05)
    scheduler.shutdown(wait=False)
    dispatcher.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--store", required=True, help="sqlite:///PATH or a postgresql:// DSN")
    p.add_argument("--workers", type=int, required=True)
    args = p.parse_args()
    serve(args.store, args.workers)


if __name__ == "__main__":
    main()
