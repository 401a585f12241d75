"""Benchmark: the worker's CPU per HTTP request, wheel's lean client against
aiohttp's ``ClientSession``.

    python benchmarks/http_client.py                       # 20,000 requests, 64 in flight
    python benchmarks/http_client.py --requests 50000 --concurrency 128 --json out.json

A receiver in a process of its own answers every request on kept-alive
connections (``200``, a short body); this process sends ``--requests``
POSTs with ``--concurrency`` in flight, each a task as the worker runs them,
and reads its own CPU time around them (the receiver's is not counted).
The aiohttp and no-op figures run each request as a task of its own.

- ``wheel_executor``: ``HttpExecutor.start`` on a run as the worker holds
  it (a Standard Webhooks-signed request with the run's headers, the outcome
  and the result's JSON), the next run started from the callback that ends
  one, as the worker's runner does: what a run of the ``http`` handler costs
  the worker beyond the stream.
- ``aiohttp_session``: ``ClientSession.post`` of the same bytes and
  ``await resp.read()``: the same request with the obvious library.
- ``noop_task``: a task that does nothing: the floor under both.

Printed as JSON: requests/s and CPU µs per request of each, and
``aiohttp_over_wheel``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from wheel import webhooks
from wheel.rpc.v1 import jobs_pb2
from wheel.rpc.v1 import worker_service_pb2 as pb
from wheel.worker._api import run_context
from wheel.worker._http import HttpExecutor
from wheel.worker._runs import HTTP, Run

RECEIVER = r"""
import asyncio, sys

RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"

class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.t = transport
        self.buf = b""

    def data_received(self, data):
        buf = self.buf + data
        out = []
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            n = 0
            for line in buf[:end].lower().split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    n = int(line[15:])
            if len(buf) < end + 4 + n:
                break
            buf = buf[end + 4 + n:]
            out.append(RESPONSE)
        self.buf = buf
        if out:
            self.t.write(b"".join(out))

async def main():
    server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


class _Holder:
    held: dict[int, Run] = {}

    def complete(self, done: Any) -> None:
        pass


async def _drive(n: int, concurrency: int, one: Any) -> tuple[float, float]:
    """``n`` calls of ``one(i)``, each a task, ``concurrency`` at once: (wall s, CPU s)."""
    sem = asyncio.Semaphore(concurrency)
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    left = n

    async def task(i: int) -> None:
        nonlocal left
        try:
            await one(i)
        finally:
            sem.release()
            left -= 1
            if left == 0:
                done.set_result(None)

    tasks = set()
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(n):
        await sem.acquire()
        t = loop.create_task(task(i))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
    await done
    return time.perf_counter() - wall, time.process_time() - cpu


async def bench(port: int, n: int, concurrency: int) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}/hook"
    body = b'{"report": "daily", "n": 1}'
    payload = jobs_pb2.HttpCall(
        target=jobs_pb2.HttpTarget(
            url=url, headers=[jobs_pb2.HttpHeader(name="X-Team", value="a")]
        ),
        body=body,
    ).SerializeToString()
    key = webhooks.parse_secret(webhooks.new_secret())
    stamp = int(time.time())
    executor = HttpExecutor(allow_private=True)
    holder = _Holder()

    def run_of(i: int) -> Run:
        signed = webhooks.signed_headers([key], f"fire-{i}", stamp, body)
        a = pb.Assignment(
            run_id=i,
            handler="http",
            payload=payload,
            idempotency_key=f"fire-{i}",
            signed_headers=[jobs_pb2.HttpHeader(name=k, value=v) for k, v in signed],
        )
        ctx = run_context(
            i, 1, "http", "default", payload, f"fire-{i}", i, 1, 1_796_644_800_000, 0, math.inf
        )
        return Run(holder, ctx, None, HTTP, a)

    runs = [run_of(i) for i in range(n)]
    failures = 0

    async def by_callbacks(count: int) -> tuple[float, float]:
        """``count`` runs through ``HttpExecutor.start``, as the worker's
        runner starts them: ``concurrency`` in flight, the next started
        from the callback that ends one (no task per run)."""
        loop = asyncio.get_running_loop()
        finished = loop.create_future()
        state = {"next": 0, "left": count}

        def done(run: Run, finish: Any) -> None:
            nonlocal failures
            failures += finish[0] != pb.OUTCOME_SUCCEEDED
            state["left"] -= 1
            if state["left"] == 0:
                finished.set_result(None)
            elif state["next"] < count:
                launch()

        def launch() -> None:
            i = state["next"]
            state["next"] += 1
            run = runs[i]
            run.task = None
            executor.start(run, done)

        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(min(concurrency, count)):
            launch()
        await finished
        return time.perf_counter() - wall, time.process_time() - cpu

    out: dict[str, Any] = {"requests": n, "concurrency": concurrency}
    await by_callbacks(min(n, 2_000))  # warm-up
    wall, cpu = await by_callbacks(n)
    out["wheel_executor"] = {
        "per_s": round(n / wall),
        "cpu_us_per_request": round(cpu / n * 1e6, 1),
    }
    executor.close()

    import aiohttp

    headers = {h.name: h.value for h in runs[0].assignment.signed_headers}  # type: ignore[union-attr]
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def aiohttp_one(i: int) -> None:
            nonlocal failures
            async with session.post(url, data=body, headers={**headers, "X-Team": "a"}) as resp:
                await resp.read()
                failures += resp.status != 200

        await _drive(min(n, 2_000), concurrency, aiohttp_one)
        wall, cpu = await _drive(n, concurrency, aiohttp_one)
    out["aiohttp_session"] = {
        "per_s": round(n / wall),
        "cpu_us_per_request": round(cpu / n * 1e6, 1),
    }

    async def noop(i: int) -> None:
        pass

    wall, cpu = await _drive(n, concurrency, noop)
    out["noop_task"] = {"cpu_us_per_request": round(cpu / n * 1e6, 1)}
    out["aiohttp_over_wheel"] = round(
        out["aiohttp_session"]["cpu_us_per_request"] / out["wheel_executor"]["cpu_us_per_request"],
        2,
    )
    out["failures"] = failures
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--json", type=Path, help="also write the figures here")
    ns = p.parse_args()
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout is not None
        port = int(receiver.stdout.readline())
        out = asyncio.run(bench(port, ns.requests, ns.concurrency))
    finally:
        receiver.kill()
        receiver.wait()
    text = json.dumps(out, indent=2)
    print(text)
    if ns.json:
        ns.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
