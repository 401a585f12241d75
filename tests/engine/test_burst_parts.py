"""A burst's claims taken in parts (``Driver.take_claims``): each part is a
batch with the first claims and whatever else waits, the rest of the claims
wait for the batches after it, and every fire is claimed and handed out
once whatever the parts."""

from __future__ import annotations

from tests.engine.sim import MIN, RefStore
from wheel.engine.driver import Driver
from wheel.engine.owner import Outcome, Owner, OwnerConfig
from wheel.engine.spec import JobSpec, Once

T = 1_800_000_000_000


def burst(count: int) -> tuple[Driver, RefStore]:
    """An owner with one worker and ``count`` one-shots due at T + MIN, fired."""
    store = RefStore()
    driver = Driver(Owner(epochs=dict.fromkeys(range(256), 1), now_ms=T, config=OwnerConfig()))
    driver.owner.worker_hello("w1", 100, ["default"], T, driver.acts)
    for i in range(count):
        new = driver.new_job(
            JobSpec(name=f"j{i}", handler="h", schedule=Once(at_ms=T + MIN)), None, T
        )
        driver.submitted(store.submit_job(new.spec, T, new.next_run_at), T)
    driver.advance(T + MIN)
    store.now_ms = T + MIN
    return driver, store


def test_a_burst_goes_in_parts_and_every_fire_is_handed_out_once() -> None:
    driver, store = burst(5)
    first = driver.take_claims(2)
    second = driver.take_claims(2)
    assert first is not None and second is not None
    assert (len(first.claims), len(second.claims)) == (2, 2)
    assert first.size() == 2 and first.epochs == driver.owner.shards()
    # One left: it fits a batch, which takes it with whatever else waits.
    assert driver.take_claims(2) is None
    rest = driver.take_batch()
    assert len(rest.claims) == 1
    claimed = [c.job_id for b in (first, second, rest) for c in b.claims]
    assert len(set(claimed)) == 5
    # Each part's runs go out once its answer is applied, the parts in order.
    handed: list[int] = []
    for part in (first, second, rest):
        driver.apply(store.write_batch(part), T + MIN, part.epochs)
        out = driver.take_messages().assignments.get("w1", [])
        assert sorted(a.job_id for a in out) == sorted(c.job_id for c in part.claims)
        handed += [a.job_id for a in out]
    assert sorted(handed) == sorted(claimed)


def test_no_limit_or_a_burst_that_fits_leaves_every_claim_to_the_one_batch() -> None:
    driver, _ = burst(3)
    assert driver.take_claims(0) is None
    assert driver.take_claims(3) is None
    assert len(driver.take_batch().claims) == 3


def test_completions_ride_with_a_part_and_never_wait_behind_a_backlog() -> None:
    """Under a backlog every batch is a part: one that left the completions
    out would hold the workers' runs (and their credit) until it cleared."""
    driver, store = burst(5)
    first = driver.take_claims(2)
    assert first is not None
    driver.apply(store.write_batch(first), T + MIN, first.epochs)
    done = driver.take_messages().assignments["w1"][0]
    driver.owner.worker_complete(
        "w1", [(done.run_id, done.fence, Outcome.SUCCEEDED, "")], T + MIN, driver.acts
    )
    second = driver.take_claims(2)
    assert second is not None
    assert len(second.claims) == 2
    assert [c.run_id for c in second.completions] == [done.run_id]
