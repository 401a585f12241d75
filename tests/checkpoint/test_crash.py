"""SIGKILL a real process mid-append: every acknowledged record comes back intact."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from wheel.checkpoint import Checkpoint, Durability, Identity, pack_u64s, unpack_u64s

IDENT = Identity(cluster_id="crash", shard_set="0-255")

# The child recovers, then appends batches of varying size and prints the last
# acknowledged seq after each append, while a second thread keeps writing
# snapshots of "state up to seq N". Records say which batch they belong to, so
# the parent can check that batches are whole.
_CHILD = r"""
import sys, threading
from wheel.checkpoint import Checkpoint, Identity, pack_u64s

def record(seq, first, n):
    return b"%d|%d|%d|" % (seq, first, n) + bytes([seq % 251]) * (seq % 40)

def snapshot(upto):
    return [b"snap-%d" % upto, bytes([upto % 251]) * 300_000, pack_u64s(range(upto, upto + 50))]

path, durability = sys.argv[1], sys.argv[2]
cp = Checkpoint.open(path, Identity(cluster_id="crash", shard_set="0-255"),
                     durability=durability, initial_map_size=256 * 1024)
cp.recover()
seq = cp.last_seq()

def snapshotter():
    while True:
        upto = cp.last_seq()
        cp.write_snapshot(snapshot(upto), upto)

threading.Thread(target=snapshotter, daemon=True).start()
while True:
    n = 1 + seq % 97
    first = seq + 1
    seq = cp.append([record(s, first, n) for s in range(first, first + n)])
    sys.stdout.write("%d\n" % seq)
    sys.stdout.flush()
"""


def _record(seq: int, first: int, n: int) -> bytes:
    return b"%d|%d|%d|" % (seq, first, n) + bytes([seq % 251]) * (seq % 40)


def _run_and_kill(path: Path, durability: Durability, rng: random.Random) -> int:
    """Start the child, SIGKILL it at a random moment, return the last seq it acknowledged."""
    with subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path), durability.value],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        acked = [0]

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                acked[0] = int(line)

        reader = threading.Thread(target=read)
        reader.start()
        deadline = time.monotonic() + 10
        while acked[0] == 0 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.05, 0.6))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join()
        assert proc.stderr is not None
        stderr = proc.stderr.read().decode()
    assert proc.returncode == -signal.SIGKILL, stderr
    assert acked[0] > 0, f"child acknowledged nothing: {stderr}"
    return acked[0]


def _check(path: Path, acked: int) -> int:
    with Checkpoint.open(path, IDENT) as cp:
        r = cp.recover()
    assert r.warnings == []
    if r.snapshot is not None:
        upto = r.snapshot_seq
        assert r.snapshot[0] == b"snap-%d" % upto
        assert r.snapshot[1] == bytes([upto % 251]) * 300_000
        assert unpack_u64s(r.snapshot[2]) == list(range(upto, upto + 50))
    last = r.records[-1][0] if r.records else r.snapshot_seq
    assert last >= acked, f"acknowledged seq {acked} lost (recovered up to {last})"
    counts: Counter[int] = Counter()
    sizes: dict[int, int] = {}
    for seq, data in r.records:
        s, first, n, _rest = data.split(b"|", 3)
        assert int(s) == seq
        assert data == _record(seq, int(first), int(n))
        counts[int(first)] += 1
        sizes[int(first)] = int(n)
    # Snapshots are taken at a last_seq, which is always a batch end, so every
    # batch in the log must be whole: group commit is all or nothing.
    partial = {
        first: (counts[first], sizes[first]) for first in counts if counts[first] != sizes[first]
    }
    assert partial == {}
    return last


def _crash_loop(tmp_path: Path, durability: Durability, iterations: int) -> None:
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    path = tmp_path / "cp"
    previous = 0
    for _ in range(iterations):
        acked = _run_and_kill(path, durability, rng)
        assert acked > previous  # each run recovered and continued
        previous = _check(path, acked)


@pytest.mark.slow
@pytest.mark.parametrize("durability", [Durability.SYNC, Durability.ASYNC])
def test_sigkill_loses_no_acknowledged_record(tmp_path: Path, durability: Durability) -> None:
    _crash_loop(tmp_path, durability, iterations=3)


@pytest.mark.stress
@pytest.mark.skipif(not os.environ.get("WHEEL_STRESS"), reason="set WHEEL_STRESS=1")
@pytest.mark.parametrize("durability", list(Durability))
def test_sigkill_loop_stress(tmp_path: Path, durability: Durability) -> None:
    _crash_loop(tmp_path, durability, iterations=30)


def test_codec_helpers_used_by_the_child_round_trip() -> None:
    assert unpack_u64s(pack_u64s(range(5, 55))) == list(range(5, 55))
