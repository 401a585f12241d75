"""The owner as composed parts (``wheel.engine.owner``): each part is one
object with its own state, the owner wires the seams between them, and each
part answers for its state through its own methods."""

from __future__ import annotations

from tests.engine.sim import HOUR, MIN
from tests.engine.test_owner import Node, T, spec
from wheel.engine.model import RunState
from wheel.engine.owner import Actions, Owner
from wheel.engine.owner._dispatch import Dispatcher
from wheel.engine.owner._jobs import JobBook
from wheel.engine.owner._runs import RunEndings
from wheel.engine.owner._shards import ShardMoves
from wheel.engine.owner._workers import WorkerStreams
from wheel.engine.spec import Once


def test_the_owner_and_its_parts_are_classes_of_at_most_one_base() -> None:
    for cls in (Owner, JobBook, Dispatcher, RunEndings, WorkerStreams, ShardMoves):
        assert len([b for b in cls.__mro__[1:] if b is not object]) <= 1, cls


def test_the_owner_wires_the_two_way_seams_to_its_own_parts() -> None:
    owner = Node().owner
    assert owner.book.dispatcher is owner.dispatcher
    assert owner.book.ends is owner.ends
    assert owner.dispatcher.book is owner.book
    assert owner.jobs is owner.book.jobs  # one table of awake jobs


def test_the_dispatcher_keeps_a_due_fire_queued_for_its_route_until_a_worker_serves_it() -> None:
    n = Node()
    n.hello("mailer", handlers=("mail",))
    j = n.submit(spec(handler="report", schedule=Once(at_ms=T + MIN)))
    n.step(T + MIN)
    dispatcher = n.owner.dispatcher
    assert dispatcher.backlog() == (1, 0)
    assert list(dispatcher.fresh) == [("default", "report")]
    assert [(u.handler, u.waiting) for u in dispatcher.unserved()] == [("report", 1)]
    n.hello("reporter", handlers=("report",))
    acts = n.step()
    [a] = acts.assignments["reporter"]
    assert a.job_id == j
    assert dispatcher.backlog() == (0, 0) and dispatcher.unserved() == []


def test_the_book_keeps_a_job_due_later_at_rest_and_wakes_it_when_read() -> None:
    n = Node()
    j = n.submit(spec(schedule=Once(at_ms=T + HOUR)))
    n.step()
    book = n.owner.book
    assert book.has_job(j) and book.job_count() == 1
    assert j not in book.jobs  # a row of its shard's table, not an object
    job = book.job(j)
    assert job is not None and job.next_fire == T + HOUR and j in book.jobs


def test_a_cancel_in_the_book_ends_the_jobs_runs_through_the_run_endings() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(schedule=Once(at_ms=T + MIN)))
    n.step(T + MIN)
    [run] = [r for r in n.owner.runs.values() if r.job_id == j]
    acts = Actions()
    n.owner.book.cancel_job(j, acts, T + MIN)
    assert [(c.run_id, c.state) for c in acts.completions] == [(run.run_id, RunState.CANCELLED)]
    assert [r.run_id for r in acts.revokes["w1"]] == [run.run_id]
