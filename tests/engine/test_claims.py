"""Claims on their way to the store, on their own
(``wheel.engine.owner._claims``). Invariant numbers are the module's."""

from __future__ import annotations

from wheel.engine.owner._claims import Claims, _Pending

T = 1_000_000


def test_an_answer_takes_a_claim_out_once_invariant_1() -> None:
    claims = Claims()
    pend = _Pending(7, T, 0, fence=1, worker_id="w1")
    claims.sent(pend)
    assert len(claims) == 1 and claims.keys() == [(7, T, 0)]
    assert claims.answered(7, T, 1) is None  # another attempt: not sent
    assert claims.answered(7, T, 0) is pend
    assert claims.answered(7, T, 0) is None and not claims


def test_a_claim_whose_worker_went_away_is_meant_for_none_invariant_2() -> None:
    claims = Claims()
    claims.sent(_Pending(1, T, 0, fence=1, worker_id="w1"))
    claims.sent(_Pending(2, T, 0, fence=2, worker_id="w2"))
    claims.orphan("w1")
    assert sorted((p.job_id, p.worker_id) for p in claims.values()) == [(1, None), (2, "w2")]


def test_a_hand_over_drops_the_claims_of_its_jobs_and_returns_them() -> None:
    claims = Claims()
    for job_id in (1, 2, 3):
        claims.sent(_Pending(job_id, T, 0, fence=job_id, worker_id="w1"))
    dropped = claims.drop(lambda job_id: job_id != 2)
    assert sorted(p.job_id for p in dropped) == [1, 3]
    assert claims.keys() == [(2, T, 0)]
