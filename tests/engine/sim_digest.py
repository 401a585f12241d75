"""A digest of every decision the owner makes in one simulated run: each store
batch it writes and each message it publishes, in order. Run as a script
(``python -m tests.engine.sim_digest SEED``) it prints the digest, so a run
of the compiled engine and one of its sources (``WHEEL_PURE_PYTHON=1``) can
be compared decision for decision."""

from __future__ import annotations

import hashlib
import sys

from tests.engine.sim import HOUR, Sim, SimScale
from wheel.engine.owner import Actions
from wheel.engine.records import BatchOutcome, WriteBatch

SCALE = SimScale(jobs=150, days=0.5, node_restart_every=2 * HOUR, quiet_ms=HOUR)


def digest(seed: int, scale: SimScale = SCALE) -> tuple[str, int]:
    """The run's digest and how many decisions it covers."""
    h = hashlib.sha256()
    count = 0

    class Recording(Sim):
        def _publish(self, acts: Actions) -> None:
            nonlocal count
            count += 1
            h.update(
                repr(
                    (
                        self.now,
                        sorted(
                            (w, [(a.run_id, a.fence) for a in v])
                            for w, v in acts.assignments.items()
                        ),
                        sorted(
                            (w, [(r.run_id, r.accepted) for r in v])
                            for w, v in acts.results.items()
                        ),
                        sorted((w, [r.run_id for r in v]) for w, v in acts.revokes.items()),
                    )
                ).encode()
            )
            super()._publish(acts)

        def iterate(self) -> None:
            store = self.store
            write = store.write_batch

            def recorded(batch: WriteBatch) -> BatchOutcome:
                nonlocal count
                count += 1
                h.update(
                    repr(
                        (
                            [(c.run_id, c.fence, c.state) for c in batch.completions],
                            [(c.job_id, c.scheduled_for, c.attempt, c.fence) for c in batch.claims],
                            [(m.job_id, m.scheduled_for, m.reason) for m in batch.missed],
                            [(a.job_id, a.new_next_run_at) for a in batch.advances],
                        )
                    ).encode()
                )
                return write(batch)

            store.write_batch = recorded  # type: ignore[method-assign]
            try:
                super().iterate()
            finally:
                store.write_batch = write  # type: ignore[method-assign]

    Recording(seed, scale).run()
    return h.hexdigest(), count


if __name__ == "__main__":
    d, n = digest(int(sys.argv[1]))
    print(d, n)
