"""A handler's return value is its run's result: ``{"value": ...}`` in the
completion when it is JSON of at most 64 KiB, a failure for good naming its
type or size when not, nothing at all for ``None``; whatever kind of
handler returned it (a thread, a task, or run inline)."""

from __future__ import annotations

import asyncio
import json

from tests.worker.scripted import assign, assignment, node, running, scenario
from wheel.rpc.v1 import worker_service_pb2 as pb
from wheel.worker import RunContext, Worker


def test_return_values_become_results_or_fail_the_run_for_good() -> None:
    big = "x" * 70_000

    async def go() -> None:
        async with node() as (svc, target):
            w = Worker(target, capacity=16)

            @w.handler()
            def sync_dict(ctx: RunContext) -> object:
                return {"rows": 3, "name": "caf\u00e9"}

            @w.handler()
            async def task_list(ctx: RunContext) -> object:
                await asyncio.sleep(0)
                return [1, 2.5, None, True]

            @w.handler()
            async def inline_str(ctx: RunContext) -> object:
                return "done"

            @w.handler()
            def nothing(ctx: RunContext) -> None:
                return None

            @w.handler()
            async def a_set(ctx: RunContext) -> object:
                return {1, 2}

            @w.handler()
            def too_big(ctx: RunContext) -> object:
                return big

            @w.handler()
            def not_a_number(ctx: RunContext) -> object:
                return float("nan")

            names = [
                "sync_dict",
                "task_list",
                "inline_str",
                "nothing",
                "a_set",
                "too_big",
                "not_a_number",
            ]
            async with running(w):
                conn, _ = await svc.accept()
                assign(conn, *(assignment(i + 1, n) for i, n in enumerate(names)))
                done = dict(await conn.completed(len(names)))
                # The worker goes on: a later run of the same handler still reports.
                assign(conn, assignment(100, "sync_dict"))
                later = (await conn.completed(len(names) + 1))[100]
            assert later.outcome == pb.OUTCOME_SUCCEEDED
            by = {names[rid - 1]: c for rid, c in done.items()}
            ok = pb.OUTCOME_SUCCEEDED
            assert by["sync_dict"].outcome == ok
            assert json.loads(by["sync_dict"].result_json) == {
                "value": {"rows": 3, "name": "caf\u00e9"}
            }
            assert json.loads(by["task_list"].result_json) == {"value": [1, 2.5, None, True]}
            assert by["inline_str"].result_json == '{"value":"done"}'
            assert (by["nothing"].outcome, by["nothing"].result_json) == (ok, "")
            for name in ("a_set", "too_big", "not_a_number"):
                assert by[name].outcome == pb.OUTCOME_FAILED, name
                assert by[name].result_json == "", name
            assert by["a_set"].error.startswith(
                "the handler returned a set a run cannot keep as its result (not JSON-serialisable"
            ), by["a_set"].error
            assert by["too_big"].error == (
                "the handler returned a str of 70012 bytes as JSON; a run keeps at most 65536"
            )
            assert "returned a float a run cannot keep" in by["not_a_number"].error

    scenario(go)
