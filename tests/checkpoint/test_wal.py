"""The LMDB checkpoint: group-committed log, snapshots, torn tails and corruption."""

from __future__ import annotations

import logging
import os
import struct
import subprocess
import sys
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lmdb
import pytest

from wheel.checkpoint import Checkpoint, CheckpointError, Durability, DutyCycle, Identity, wal
from wheel.errors import InvalidArgument

IDENT = Identity(cluster_id="cluster-a", shard_set="0-255")
KEY = struct.Struct(">Q")
PIECE_KEY = struct.Struct(">QI")


def payload(seq: int) -> bytes:
    return b"record-%d-" % seq + bytes([seq % 251]) * (seq % 13)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "cp"


@pytest.fixture
def cp(path: Path) -> Iterator[Checkpoint]:
    c = Checkpoint.open(path, IDENT)
    yield c
    c.close()


def fill(c: Checkpoint, upto: int, batch: int = 10) -> None:
    seq = c.last_seq()
    while seq < upto:
        n = min(batch, upto - seq)
        seq = c.append([payload(s) for s in range(seq + 1, seq + n + 1)])


def expected(first: int, last: int) -> list[tuple[int, bytes]]:
    return [(s, payload(s)) for s in range(first, last + 1)]


def raw_edit(path: Path, db_name: bytes, edit: object) -> None:
    """Open the closed checkpoint's LMDB directly and let ``edit(txn, db)`` damage it."""
    env = lmdb.open(str(path), max_dbs=4)
    try:
        db = env.open_db(db_name)
        with env.begin(write=True) as txn:
            edit(txn, db)  # type: ignore[operator]
    finally:
        env.close()


def _stored(value: bytes | memoryview | None) -> bytes:
    assert value is not None
    return bytes(value)


def flip_byte(txn: lmdb.Transaction, db: Any, key: bytes, index: int = -1) -> None:
    value = bytearray(_stored(txn.get(key, db=db)))
    value[index] ^= 0x40
    txn.put(key, bytes(value), db=db)


# -- the log -------------------------------------------------------------------


def test_append_returns_last_seq_and_recover_returns_records_in_order(path: Path) -> None:
    with Checkpoint.open(path, IDENT) as c:
        assert c.last_seq() == 0
        assert c.append([b"a", b"b", b"c"]) == 3
        assert c.append([]) == 3
        assert c.append([b"", b"e" * 10_000]) == 5
        assert c.log_records() == 5
    with Checkpoint.open(path, IDENT) as c:
        assert c.last_seq() == 5
        r = c.recover()
        assert r.snapshot is None
        assert r.snapshot_seq == 0
        assert r.records == [(1, b"a"), (2, b"b"), (3, b"c"), (4, b""), (5, b"e" * 10_000)]
        assert r.warnings == []
        assert c.append([b"f"]) == 6


def test_each_batch_is_one_write_transaction(cp: Checkpoint) -> None:
    before = cp._env.info()["last_txnid"]
    cp.append([b"x"] * 1000)
    cp.append([b"y"] * 10)
    assert cp._env.info()["last_txnid"] == before + 2


def test_a_batch_that_cannot_commit_leaves_no_record_behind(path: Path) -> None:
    with Checkpoint.open(path, IDENT, initial_map_size=256 * 1024, max_map_size=512 * 1024) as c:
        fill(c, 100)
        with pytest.raises(CheckpointError, match="max_map_size"):
            c.append([b"z" * 1000] * 1000)  # ~1 MB: more than the map may ever hold
        assert c.last_seq() == 100
        assert c.append([b"after"]) == 101
    with Checkpoint.open(path, IDENT, initial_map_size=256 * 1024) as c:
        r = c.recover()
        assert r.records == [*expected(1, 100), (101, b"after")]


def test_a_tiny_map_grows_until_everything_fits(path: Path) -> None:
    with Checkpoint.open(path, IDENT, initial_map_size=64 * 1024) as c:
        fill(c, 20_000, batch=500)
        assert c.map_size() > 64 * 1024
        c.write_snapshot([b"s" * 600_000], 10_000)
    with Checkpoint.open(path, IDENT, initial_map_size=64 * 1024) as c:
        r = c.recover()
        assert r.snapshot == [b"s" * 600_000]
        assert r.records == expected(10_001, 20_000)


def test_initial_map_below_lmdb_minimum_is_rejected(path: Path) -> None:
    with pytest.raises(InvalidArgument):
        Checkpoint.open(path, IDENT, initial_map_size=4096)


@pytest.mark.parametrize("durability", list(Durability))
def test_every_durability_mode_round_trips(path: Path, durability: Durability) -> None:
    with Checkpoint.open(path, IDENT, durability=durability) as c:
        fill(c, 300)
        c.write_snapshot([b"snap"], 200)
        if durability is not Durability.SYNC:
            assert (path / "unclean").exists()
    assert not (path / "unclean").exists()
    with Checkpoint.open(path, IDENT, durability=durability) as c:
        r = c.recover()
        assert r.snapshot == [b"snap"]
        assert r.records == expected(201, 300)


# -- snapshots -----------------------------------------------------------------


def test_snapshot_truncates_the_log_and_recovery_replays_only_later_records(path: Path) -> None:
    big = os.urandom(700_000)  # split into several LMDB values, rejoined on recovery
    chunks = [b"first", big, b"", b"last"]
    with Checkpoint.open(path, IDENT) as c:
        fill(c, 50)
        c.write_snapshot(iter(chunks), 30)
        assert c.log_records() == 20
        fill(c, 60)
        r = c.recover()
        assert r.snapshot == chunks
        assert r.snapshot_seq == 30
        assert r.records == expected(31, 60)
    with Checkpoint.open(path, IDENT) as c:
        assert c.last_seq() == 60
        r = c.recover()
        assert r.snapshot == chunks
        assert r.records == expected(31, 60)


def test_snapshot_of_everything_keeps_seqs_increasing(cp: Checkpoint, path: Path) -> None:
    fill(cp, 40)
    cp.write_snapshot([], 40)
    assert cp.log_records() == 0
    cp.close()
    with Checkpoint.open(path, IDENT) as c:
        assert c.last_seq() == 40
        r = c.recover()
        assert (r.snapshot, r.snapshot_seq, r.records) == ([], 40, [])
        assert c.append([b"next"]) == 41


def test_repeated_snapshots_reuse_space_instead_of_growing(cp: Checkpoint) -> None:
    chunk = b"q" * 400_000
    fill(cp, 10)
    cp.write_snapshot([chunk, chunk], 10)
    one = cp.snapshot_bytes()
    for i in range(8):
        fill(cp, 20 + 10 * i, batch=100)
        cp.write_snapshot([chunk, chunk], cp.last_seq())
    assert cp.snapshot_bytes() == one
    size = cp.file_bytes()
    for _ in range(4):
        fill(cp, cp.last_seq() + 2000, batch=500)
        cp.write_snapshot([chunk, chunk], cp.last_seq())
    assert cp.file_bytes() <= size * 2  # freed pages are reused: the file stops growing
    assert cp.log_records() == 0


def test_snapshot_seq_must_be_known_and_not_older_than_current(cp: Checkpoint) -> None:
    fill(cp, 10)
    with pytest.raises(InvalidArgument):
        cp.write_snapshot([b"x"], 11)
    cp.write_snapshot([b"x"], 8)
    with pytest.raises(InvalidArgument):
        cp.write_snapshot([b"y"], 7)
    assert cp.recover().snapshot == [b"x"]


def test_a_failing_chunk_source_keeps_the_previous_snapshot(cp: Checkpoint) -> None:
    fill(cp, 10)
    cp.write_snapshot([b"old"], 5)
    size = cp.snapshot_bytes()

    def chunks() -> Iterator[bytes]:
        yield b"n" * 5_000_000  # more than one write transaction's worth
        raise RuntimeError("owner failed while encoding")

    with pytest.raises(RuntimeError):
        cp.write_snapshot(chunks(), 10)
    assert cp.snapshot_bytes() == size
    r = cp.recover()
    assert (r.snapshot, r.snapshot_seq) == ([b"old"], 5)
    assert r.records == expected(6, 10)


def test_pieces_of_an_interrupted_snapshot_are_ignored_then_cleaned(path: Path) -> None:
    with Checkpoint.open(path, IDENT) as c:
        fill(c, 10)
        c.write_snapshot([b"current"], 4)
    # A crash mid-write leaves pieces of a newer id that never became current.
    raw_edit(path, b"snap", lambda txn, db: txn.put(PIECE_KEY.pack(99, 0), b"junk", db=db))
    with Checkpoint.open(path, IDENT) as c:
        assert c.recover().snapshot == [b"current"]
        c.write_snapshot([b"newer"], 10)
        assert c.recover().snapshot == [b"newer"]
    env = lmdb.open(str(path), max_dbs=4)
    with env.begin(db=env.open_db(b"snap")) as txn:
        ids = {PIECE_KEY.unpack(k)[0] for k, _ in txn.cursor()}
    env.close()
    assert len(ids) == 1


def test_snapshots_can_be_written_while_another_thread_appends(cp: Checkpoint) -> None:
    done = threading.Event()
    errors: list[BaseException] = []

    def snapshotter() -> None:
        try:
            while not done.is_set():
                upto = cp.last_seq()
                cp.write_snapshot([b"%d" % upto, b"p" * 300_000], upto)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=snapshotter)
    t.start()
    try:
        fill(cp, 30_000, batch=200)
    finally:
        done.set()
        t.join()
    assert errors == []
    r = cp.recover()
    assert r.snapshot is not None
    assert r.snapshot[0] == b"%d" % r.snapshot_seq
    assert r.records == expected(r.snapshot_seq + 1, 30_000)


# -- torn tails and corruption ---------------------------------------------------


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda v: v[:5], id="header-truncated"),
        pytest.param(lambda v: v[:-3], id="payload-truncated"),
        pytest.param(lambda v: v[:-1] + bytes([v[-1] ^ 1]), id="byte-flipped"),
        pytest.param(lambda v: b"\x07" + v[1:], id="unknown-record-version"),
    ],
)
def test_a_torn_final_record_is_dropped_with_a_warning(
    path: Path, caplog: pytest.LogCaptureFixture, damage: object
) -> None:
    with Checkpoint.open(path, IDENT) as c:
        fill(c, 20)
    raw_edit(
        path,
        b"log",
        lambda txn, db: txn.put(KEY.pack(20), damage(txn.get(KEY.pack(20), db=db)), db=db),  # type: ignore[operator]
    )
    with Checkpoint.open(path, IDENT) as c, caplog.at_level(logging.WARNING):
        r = c.recover()
        assert r.records == expected(1, 19)
        assert len(r.warnings) == 1
        assert "torn final log record 20" in r.warnings[0]
        assert "torn final log record 20" in caplog.text
        assert c.last_seq() == 19
        assert c.append([payload(20)]) == 20
    with Checkpoint.open(path, IDENT) as c:
        r = c.recover()
        assert r.records == expected(1, 20)
        assert r.warnings == []


def test_a_corrupt_record_before_the_tail_raises_and_blocks_use_until_reset(path: Path) -> None:
    with Checkpoint.open(path, IDENT) as c:
        fill(c, 20)
    raw_edit(path, b"log", lambda txn, db: flip_byte(txn, db, KEY.pack(10)))
    with Checkpoint.open(path, IDENT) as c:
        with pytest.raises(CheckpointError, match="record 10 is corrupt"):
            c.recover()
        with pytest.raises(CheckpointError):
            c.append([b"x"])
        c.reset()
        assert c.last_seq() == 0
        assert c.append([b"fresh"]) == 1
        assert c.recover().records == [(1, b"fresh")]


def test_a_gap_in_seqs_raises(path: Path) -> None:
    with Checkpoint.open(path, IDENT) as c:
        fill(c, 20)
    raw_edit(path, b"log", lambda txn, db: txn.delete(KEY.pack(7), db=db))
    with Checkpoint.open(path, IDENT) as c, pytest.raises(CheckpointError, match="gap"):
        c.recover()


def test_a_gap_right_after_the_snapshot_raises(path: Path) -> None:
    with Checkpoint.open(path, IDENT) as c:
        fill(c, 20)
        c.write_snapshot([b"s"], 10)
    raw_edit(path, b"log", lambda txn, db: txn.delete(KEY.pack(11), db=db))
    with Checkpoint.open(path, IDENT) as c, pytest.raises(CheckpointError, match="expected seq 11"):
        c.recover()


def _only_piece_key(txn: lmdb.Transaction, db: Any) -> bytes:
    keys = [bytes(k) for k, _ in txn.cursor(db=db)]
    return keys[len(keys) // 2]


def test_a_flipped_byte_in_a_snapshot_chunk_raises(path: Path) -> None:
    with Checkpoint.open(path, IDENT) as c:
        fill(c, 20)
        c.write_snapshot([b"a" * 1000, b"b" * 1000, b"c" * 1000], 10)
    raw_edit(path, b"snap", lambda txn, db: flip_byte(txn, db, _only_piece_key(txn, db), 500))
    with Checkpoint.open(path, IDENT) as c, pytest.raises(CheckpointError, match="checksum"):
        c.recover()


def test_a_missing_snapshot_piece_raises(path: Path) -> None:
    with Checkpoint.open(path, IDENT) as c:
        fill(c, 20)
        c.write_snapshot([b"a" * 1000, b"b" * 1000, b"c" * 1000], 10)
    raw_edit(path, b"snap", lambda txn, db: txn.delete(_only_piece_key(txn, db), db=db))
    with Checkpoint.open(path, IDENT) as c, pytest.raises(CheckpointError, match="missing piece"):
        c.recover()


def test_a_damaged_snapshot_pointer_raises(path: Path) -> None:
    with Checkpoint.open(path, IDENT) as c:
        fill(c, 20)
        c.write_snapshot([b"a"], 10)
    raw_edit(path, b"meta", lambda txn, db: flip_byte(txn, db, b"snapshot", 3))
    with Checkpoint.open(path, IDENT) as c, pytest.raises(CheckpointError, match="pointer"):
        c.recover()


def test_an_unknown_format_version_raises_until_reset(path: Path) -> None:
    with Checkpoint.open(path, IDENT) as c:
        fill(c, 5)
    raw_edit(path, b"meta", lambda txn, db: txn.put(b"format", struct.pack(">I", 99), db=db))
    with Checkpoint.open(path, IDENT) as c:
        with pytest.raises(CheckpointError, match="unknown checkpoint format"):
            c.recover()
        with pytest.raises(CheckpointError):
            c.append([b"x"])
        with pytest.raises(CheckpointError):
            c.write_snapshot([b"x"], 0)
        c.reset()
        assert c.recover().records == []
    with Checkpoint.open(path, IDENT) as c:
        assert c.recover().records == []


def test_a_checkpoint_of_another_identity_is_never_used(path: Path) -> None:
    with Checkpoint.open(path, IDENT) as c:
        fill(c, 5)
    other = Identity(cluster_id="cluster-a", shard_set="0-127")
    with Checkpoint.open(path, other) as c:
        with pytest.raises(CheckpointError, match="belongs to"):
            c.recover()
        c.reset()
        assert c.append([b"mine"]) == 1
    with Checkpoint.open(path, IDENT) as c, pytest.raises(CheckpointError, match="belongs to"):
        c.recover()


def test_identity_fields_must_not_be_empty() -> None:
    with pytest.raises(InvalidArgument):
        Identity(cluster_id="", shard_set="0-255")


# -- the files -----------------------------------------------------------------


def test_opening_the_same_checkpoint_twice_in_a_process_is_refused(
    cp: Checkpoint, path: Path
) -> None:
    with pytest.raises(CheckpointError, match="already open"):
        Checkpoint.open(path, IDENT)
    with pytest.raises(CheckpointError, match="close it"):
        Checkpoint.destroy(path)
    cp.append([b"still fine"])


def test_destroy_then_open_starts_empty(path: Path) -> None:
    with Checkpoint.open(path, IDENT) as c:
        fill(c, 5)
    Checkpoint.destroy(path)
    with Checkpoint.open(path, IDENT) as c:
        assert c.last_seq() == 0
        assert c.recover().records == []


_TRUNCATE_CHILD = r"""
import os, shutil, sys
from wheel.checkpoint import Checkpoint, CheckpointError, Identity
src, work = sys.argv[1], sys.argv[2]
ident = Identity(cluster_id="cluster-a", shard_set="0-255")
size = os.path.getsize(os.path.join(src, "data.mdb"))
for cut in [0, 100, 4096, 4096 + 200, 8192, 3 * 4096, size // 2, size - 4096, size - 1]:
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(src, work)
    os.truncate(os.path.join(work, "data.mdb"), cut)
    try:
        with Checkpoint.open(work, ident) as c:
            n = len(c.recover().records)
        print(cut, "ok", n, flush=True)
    except CheckpointError as e:
        print(cut, "CheckpointError", str(e).replace(" ", "_")[:80], flush=True)
"""


def test_a_truncated_data_file_raises_checkpoint_error_never_crashes(tmp_path: Path) -> None:
    src = tmp_path / "src"
    with Checkpoint.open(src, IDENT) as c:
        fill(c, 3000, batch=300)
        c.write_snapshot([b"s" * 100_000], 1000)
    # In a child process: a SIGBUS inside LMDB must fail this test, not kill pytest.
    out = subprocess.run(
        [sys.executable, "-c", _TRUNCATE_CHILD, str(src), str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = [line.split() for line in out.stdout.splitlines()]
    assert len(lines) == 9
    for cut, outcome, *rest in lines:
        # Only a cut inside the unused tail may open, and then nothing is lost.
        assert outcome == "CheckpointError" or rest == ["2000"], (cut, outcome, rest)
    assert sum(outcome == "CheckpointError" for _, outcome, *_ in lines) >= 7


def test_after_an_unclean_async_session_a_damaged_file_is_refused(path: Path) -> None:
    with Checkpoint.open(path, IDENT, durability=Durability.ASYNC) as c:
        fill(c, 5000, batch=500)
    # Zero a B-tree page in the middle, as a power loss with unflushed pages could,
    # and leave the marker an ASYNC session that never closed leaves behind.
    data = path / "data.mdb"
    pages = data.stat().st_size // 4096
    with data.open("r+b") as f:
        f.seek(pages // 3 * 4096)
        f.write(bytes(4096 * 4))
    (path / "unclean").touch()
    with pytest.raises(CheckpointError, match="damaged"):
        Checkpoint.open(path, IDENT)


def test_after_an_unclean_async_session_an_intact_file_opens(path: Path) -> None:
    with Checkpoint.open(path, IDENT, durability=Durability.ASYNC) as c:
        fill(c, 500)
    (path / "unclean").touch()
    with Checkpoint.open(path, IDENT) as c:
        assert c.recover().records == expected(1, 500)
    assert not (path / "unclean").exists()


def test_record_checksum_covers_the_seq(path: Path) -> None:
    # Swapping two records' values (each internally consistent) must be caught.
    with Checkpoint.open(path, IDENT) as c:
        fill(c, 10)

    def swap(txn: lmdb.Transaction, db: Any) -> None:
        a, b = _stored(txn.get(KEY.pack(3), db=db)), _stored(txn.get(KEY.pack(4), db=db))
        txn.put(KEY.pack(3), b, db=db)
        txn.put(KEY.pack(4), a, db=db)
        assert zlib.crc32(a[9:]) != zlib.crc32(b[9:])

    raw_edit(path, b"log", swap)
    with Checkpoint.open(path, IDENT) as c, pytest.raises(CheckpointError, match="record 3"):
        c.recover()


def test_a_duty_cycle_sleeps_in_proportion_to_the_work_since_its_last_pause() -> None:
    now = [100.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    duty = DutyCycle(0.2, clock=lambda: now[0], sleep=sleep)
    now[0] += 0.010  # 10 ms of work
    duty.pause()
    now[0] += 0.001
    duty.pause()
    duty.pause()  # no work since: no sleep
    assert slept == pytest.approx([0.040, 0.004])
    with pytest.raises(InvalidArgument, match="share"):
        DutyCycle(0)
    full = DutyCycle(1.0, sleep=sleep)
    full.pause()
    assert len(slept) == 2  # a share of 1 never sleeps


def test_a_snapshot_pauses_between_chunks_and_between_batches_of_deletes(
    cp: Checkpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pauses fall outside write transactions, after every chunk and
    every full batch of log records truncated; the snapshot is the same."""
    monkeypatch.setattr(wal, "_DELETE_BATCH", 100)
    fill(cp, 1_000, batch=100)
    calls: list[int] = []
    cp.write_snapshot([b"a", b"b", b"c"], 950, pause=lambda: calls.append(cp.last_seq()))
    # 3 chunks, then 950 records deleted 100 at a time: 9 full batches.
    assert len(calls) == 3 + 9
    r = cp.recover()
    assert r.snapshot == [b"a", b"b", b"c"]
    assert r.records == expected(951, 1_000)
