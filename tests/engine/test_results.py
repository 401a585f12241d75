"""Run results and Retry-After through the owner: the result a worker sends
rides on the run's terminal state to the store, whatever the outcome; the
wait it asks for delays the retry of a retryable failure to the later of
its backoff and that wait, and never shortens a backoff."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.sim import MIN, SEC
from tests.engine.test_owner import Node, T, spec
from wheel.engine.model import RunState
from wheel.engine.owner import Assignment, Outcome
from wheel.engine.policy import retry_delay_ms
from wheel.engine.spec import Retry

RESULT = '{"http_status": 503, "duration_ms": 12}'


def complete(
    n: Node,
    a: Assignment,
    outcome: Outcome,
    *,
    result: str | None = None,
    retry_after_ms: int = 0,
) -> None:
    n.owner.worker_complete(
        "w1",
        [(a.run_id, a.fence, outcome, "boom" if outcome is not Outcome.SUCCEEDED else "")],
        n.now,
        n.acts,
        results={a.run_id: result} if result is not None else None,
        retry_after_ms={a.run_id: retry_after_ms} if retry_after_ms else None,
    )


def test_a_result_rides_on_the_terminal_state_of_every_outcome_to_the_store() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(retry=Retry(max_attempts=2, initial_backoff_ms=0, max_backoff_ms=0)))
    first = n.run_once(j, T + MIN)
    complete(n, first, Outcome.RETRYABLE, result=RESULT)
    acts = n.step()
    [failed] = acts.completions
    assert (failed.state, failed.result) == (RunState.FAILED, RESULT)
    assert n.store.execs[first.run_id].result == RESULT
    [retry] = acts.assignments["w1"]
    n.owner.worker_ack("w1", [(retry.run_id, retry.fence)], n.now, n.acts)
    n.step()
    complete(n, retry, Outcome.RETRYABLE, result='{"value": "last"}')
    [dead] = n.step().completions
    assert (dead.state, dead.result) == (RunState.DEAD_LETTERED, '{"value": "last"}')
    assert n.store.get_run(retry.run_id).result == '{"value": "last"}'
    # The next fire succeeds with a result of its own.
    ok = n.run_once(j, T + 2 * MIN)
    complete(n, ok, Outcome.SUCCEEDED, result='{"value": [1, 2]}')
    [done] = n.step().completions
    assert (done.state, done.result) == (RunState.SUCCEEDED, '{"value": [1, 2]}')


def test_a_completion_without_a_result_stores_none() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec())
    a = n.run_once(j, T + MIN)
    [done] = n.complete(a).completions
    assert done.result is None and n.store.execs[a.run_id].result is None


def test_a_superseded_completion_keeps_no_result() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec())
    a = n.run_once(j, T + MIN)
    n.complete(a)
    complete(n, a, Outcome.SUCCEEDED, result='{"value": "again"}')
    acts = n.step()
    assert acts.completions == []
    assert n.store.execs[a.run_id].result is None


def test_retry_after_delays_a_retry_past_a_shorter_backoff() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec())  # backoff 0: without Retry-After the retry goes at once
    a = n.run_once(j, T + MIN)
    complete(n, a, Outcome.RETRYABLE, retry_after_ms=2 * SEC)
    acts = n.step()
    assert acts.claims == [] and not acts.assignments
    assert not n.step(T + MIN + 2 * SEC - 1).assignments
    [retry] = n.step(T + MIN + 2 * SEC).assignments["w1"]
    assert (retry.job_id, retry.attempt) == (j, 1)


def test_retry_after_on_a_success_or_a_last_attempt_schedules_nothing() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(retry=Retry(max_attempts=1)))
    a = n.run_once(j, T + MIN)
    complete(n, a, Outcome.RETRYABLE, retry_after_ms=HOUR_MS)
    [dead] = n.step().completions
    assert dead.state is RunState.DEAD_LETTERED
    b = n.run_once(j, T + 2 * MIN)  # the schedule goes on: the next fire on time
    complete(n, b, Outcome.SUCCEEDED, retry_after_ms=HOUR_MS)
    assert n.step().completions[0].state is RunState.SUCCEEDED
    assert n.run_once(j, T + 3 * MIN).attempt == 0


HOUR_MS = 3600 * SEC


@settings(max_examples=40, deadline=None)
@given(
    backoff_s=st.integers(min_value=0, max_value=120),
    retry_after_ms=st.integers(min_value=0, max_value=300 * SEC),
)
def test_a_retry_goes_at_the_later_of_its_backoff_and_retry_after(
    backoff_s: int, retry_after_ms: int
) -> None:
    policy = Retry(max_attempts=3, initial_backoff_ms=backoff_s * SEC, max_backoff_ms=HOUR_MS)
    n = Node()
    n.hello()
    j = n.submit(spec(retry=policy))
    a = n.run_once(j, T + MIN)
    failed_at = n.now
    complete(n, a, Outcome.RETRYABLE, retry_after_ms=retry_after_ms)
    sent = n.step().assignments.get("w1", [])
    backoff = retry_delay_ms(policy, failed_attempt=0, job_id=j, scheduled_for=a.scheduled_for)
    due = failed_at + max(backoff, retry_after_ms)
    if due > n.now:
        assert not sent and not n.step(due - 1).assignments.get("w1")
        sent = n.step(due).assignments["w1"]
    [retry] = sent
    assert (retry.job_id, retry.attempt, retry.scheduled_for) == (j, 1, a.scheduled_for)
