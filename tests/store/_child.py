"""A separate process for the store's race and crash tests.

    python tests/store/_child.py migrate URL GO_FILE
    python tests/store/_child.py claim URL GO_FILE FENCE_BASE BATCH JOB_IDS_JSON
    python tests/store/_child.py submit URL

``GO_FILE``: the children wait for it so that they start at the same moment.
"""

from __future__ import annotations

import json
import os
import sys
import time

from wheel.engine.spec import Interval, JobSpec
from wheel.store.base import FireClaim, NewJob
from wheel.store.open import open_store


def wait_for(go_file: str) -> None:
    deadline = time.monotonic() + 30
    while not os.path.exists(go_file):
        if time.monotonic() > deadline:
            raise SystemExit("no go signal")
        time.sleep(0.001)


def main(argv: list[str]) -> None:
    cmd, url = argv[0], argv[1]
    if cmd == "migrate":
        store = open_store(url, migrate=False)
        wait_for(argv[2])
        store.migrate()
        store.close()
    elif cmd == "claim":
        go_file, fence_base, batch, job_ids = argv[2], int(argv[3]), int(argv[4]), argv[5]
        ids = json.loads(job_ids)
        store = open_store(url)
        claims = [
            FireClaim(
                job_id=j,
                scheduled_for=60_000,
                attempt=0,
                fence=fence_base + k,
                dispatched_at_ms=60_001,
                expected_next_run_at=60_000,
                new_next_run_at=120_000,
            )
            for k, j in enumerate(ids)
        ]
        wait_for(go_file)
        won, advanced = [], []
        for k in range(0, len(claims), batch):
            for o in store.claim_fires(claims[k : k + batch]):
                if o.run_id is not None:
                    won.append(o.claim.job_id)
                if o.advanced:
                    advanced.append(o.claim.job_id)
        store.close()
        print(json.dumps({"won": won, "advanced": advanced}), flush=True)
    elif cmd == "submit":
        store = open_store(url)
        job, _ = store.submit_job(
            NewJob(
                spec=JobSpec(name="durable", handler="h", schedule=Interval(period_ms=1_000)),
                created_at_ms=1,
                next_run_at=1_000,
            )
        )
        # The job is acknowledged: say so, then wait to be killed.
        print(job.job_id, flush=True)
        time.sleep(60)
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main(sys.argv[1:])
