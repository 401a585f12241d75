"""A burst's claims taken in parts (``Driver.take_claims``): each part is a
batch of claims alone, the rest waits for the batches after it, and every
fire is claimed and handed out once whatever the parts."""

from __future__ import annotations

from tests.engine.sim import MIN, RefStore
from wheel.engine.driver import Driver
from wheel.engine.owner import Owner, OwnerConfig
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


def test_a_burst_goes_in_parts_of_claims_alone_and_the_rest_with_everything_else() -> None:
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
