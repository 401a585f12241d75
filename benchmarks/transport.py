"""Benchmark: the CPU floor of one round on a worker stream.

    python benchmarks/transport.py                     # 25, 50 and 500 rounds/s
    python benchmarks/transport.py --rates 50 --runs 40 --json out.json

A round of the dispatch loop sends a worker one message (its assignments) and
reads one back (its completions). This measures that exchange with nothing of
wheel's around it: a gRPC bidirectional stream of the real ``WorkerService``
messages, the client here and an echoing ``grpc.aio`` server in a process of
its own, one message each way a round at a steady rate, each message naming
``--runs`` runs. CPU time is read from /proc for both processes.

Baseline, in the same run: the same bytes over a plain TCP socket (blocking
reads and writes, a 4-byte length before each message), what the polling
baseline's dispatch queue does. ``grpc_over_socket`` is the ratio of the two
exchanges' CPU per round; machines differ several times in speed, ratios
carry over.

``floor_cpu_s_per_1k`` is what the gRPC exchange alone costs per 1,000 fires
at ``--fires-per-s`` shared by ``--workers`` workers, each getting one round a
``1/rate`` s: the least a dispatch at that round rate can cost, whatever the
scheduler does between rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import _report
import grpc
from _harness import cpu_seconds

from wheel.rpc.v1 import worker_service_pb2 as pb
from wheel.rpc.v1 import worker_service_pb2_grpc as pbg

LENGTH = struct.Struct("!I")


class _Echo(pbg.WorkerServiceServicer):  # type: ignore[misc]  # generated, unchecked
    async def Connect(
        self, request_iterator: AsyncIterator[pb.WorkerMessage], context: Any
    ) -> AsyncIterator[pb.ServerMessage]:
        async for msg in request_iterator:
            out = pb.ServerMessage()
            out.results.accepted.extend([c.run_id for c in msg.complete.completions])
            yield out


async def _serve_grpc(port_file: Path) -> None:
    server = grpc.aio.server()
    pbg.add_WorkerServiceServicer_to_server(_Echo(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    port_file.write_text(str(port))
    await server.wait_for_termination()


def _serve_socket(port_file: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port_file.write_text(str(listener.getsockname()[1]))
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        head = _recv_exact(conn, LENGTH.size)
        if head is None:
            return
        body = _recv_exact(conn, LENGTH.unpack(head)[0])
        if body is None:
            return
        msg = pb.WorkerMessage.FromString(body)
        out = pb.ServerMessage()
        out.results.accepted.extend([c.run_id for c in msg.complete.completions])
        data = out.SerializeToString()
        conn.sendall(LENGTH.pack(len(data)) + data)


def _recv_exact(conn: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _message(runs: int) -> pb.WorkerMessage:
    msg = pb.WorkerMessage()
    add = msg.complete.completions.add
    for i in range(runs):
        add(run_id=1_000_000 + i, fence=(7 << 32) + i, outcome=pb.OUTCOME_SUCCEEDED, job_id=i)
    return msg


class _Server:
    """An echo server of ``kind`` in a process of its own."""

    def __init__(self, kind: str, tmp: Path) -> None:
        port_file = tmp / f"{kind}.port"
        port_file.unlink(missing_ok=True)
        cmd = [sys.executable, __file__, "--serve", kind, "--port-file", str(port_file)]
        self.proc = subprocess.Popen(cmd)
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"the {kind} echo server did not start")
            time.sleep(0.02)
        self.port = int(port_file.read_text())

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


async def _grpc_rounds(
    port: int, rate: float, msg: pb.WorkerMessage, seconds: float
) -> tuple[int, float]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = pbg.WorkerServiceStub(channel).Connect()
        await call.write(msg)  # the stream is up before the clock starts
        await call.read()
        n = 0
        t0 = time.monotonic()
        c0 = time.process_time()
        while time.monotonic() - t0 < seconds:
            await call.write(msg)
            await call.read()
            n += 1
            ahead = t0 + n / rate - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
        used = time.process_time() - c0
        await call.done_writing()
    return n, used


def _socket_rounds(
    port: int, rate: float, msg: pb.WorkerMessage, seconds: float
) -> tuple[int, float]:
    conn = socket.create_connection(("127.0.0.1", port))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        n = 0
        t0 = time.monotonic()
        c0 = time.process_time()
        while time.monotonic() - t0 < seconds:
            data = msg.SerializeToString()
            conn.sendall(LENGTH.pack(len(data)) + data)
            head = _recv_exact(conn, LENGTH.size)
            assert head is not None
            body = _recv_exact(conn, LENGTH.unpack(head)[0])
            assert body is not None
            pb.ServerMessage.FromString(body)
            n += 1
            ahead = t0 + n / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        return n, time.process_time() - c0
    finally:
        conn.close()


def measure(kind: str, rate: float, runs: int, seconds: float, tmp: Path) -> dict[str, float]:
    server = _Server(kind, tmp)
    msg = _message(runs)
    try:
        s0 = cpu_seconds(server.proc.pid)
        if kind == "grpc":
            n, client_s = asyncio.run(_grpc_rounds(server.port, rate, msg, seconds))
        else:
            n, client_s = _socket_rounds(server.port, rate, msg, seconds)
        server_s = cpu_seconds(server.proc.pid) - s0
    finally:
        server.stop()
    return {
        "rounds_per_s": round(n / seconds, 1),
        "client_cpu_ms_per_round": round(1000 * client_s / n, 4),
        "server_cpu_ms_per_round": round(1000 * server_s / n, 4),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="25,50,500", help="rounds per second, comma-separated")
    p.add_argument("--runs", type=int, default=40, help="runs named in each message")
    p.add_argument("--seconds", type=float, default=10.0, help="measured, per rate and transport")
    p.add_argument("--fires-per-s", type=float, default=2000.0, help="for floor_cpu_s_per_1k")
    p.add_argument("--workers", type=int, default=2, help="for floor_cpu_s_per_1k")
    p.add_argument("--json", type=Path, help="also write the JSON here")
    p.add_argument("--serve", choices=["grpc", "socket"], help=argparse.SUPPRESS)
    p.add_argument("--port-file", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve == "grpc":
        asyncio.run(_serve_grpc(args.port_file))
        return 0
    if args.serve == "socket":
        _serve_socket(args.port_file)
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="wheel-transport-"))
    rows = []
    for rate in [float(r) for r in args.rates.split(",")]:
        g = measure("grpc", rate, args.runs, args.seconds, tmp)
        s = measure("socket", rate, args.runs, args.seconds, tmp)
        g_round = g["client_cpu_ms_per_round"] + g["server_cpu_ms_per_round"]
        s_round = s["client_cpu_ms_per_round"] + s["server_cpu_ms_per_round"]
        floor = g_round / 1000 * rate * args.workers / args.fires_per_s * 1000
        rows.append(
            {
                "rate": rate,
                "runs_per_message": args.runs,
                "grpc": g,
                "socket": s,
                "grpc_cpu_ms_per_round": round(g_round, 4),
                "socket_cpu_ms_per_round": round(s_round, 4),
                "grpc_over_socket": round(g_round / s_round, 2) if s_round else None,
                "floor_cpu_s_per_1k": round(floor, 4),
                "fires_per_s": args.fires_per_s,
                "workers": args.workers,
            }
        )
    _report.emit(rows if len(rows) > 1 else rows[0], args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
