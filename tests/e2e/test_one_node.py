"""One node per address and per data directory: a second ``wheelctl serve``
on a port or a data directory in use is refused with a clear error and a
non-zero exit status, and the first node serves on untouched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testkit.procs import ServerProc, wheelctl
from testkit.services import free_port

pytestmark = pytest.mark.slow


def _jobs(target: str) -> int:
    out = wheelctl("status", "--target", target, "--json").stdout
    jobs: int = json.loads(out)["jobs"]
    return jobs


def test_a_second_node_on_a_port_or_a_data_dir_in_use_is_refused(tmp_path: Path) -> None:
    first = ServerProc(tmp_path / "first")
    first.start()
    try:
        wheelctl("submit", "--target", first.target, "--name", "hourly", "--handler", "h",
                 "--every", "1h")  # fmt: skip
        assert _jobs(first.target) == 1

        # The same port, another data directory: gRPC's port sharing would
        # have let both listen and answer in turn.
        same_port = wheelctl(
            "serve", "--data-dir", str(tmp_path / "second"), "--listen", first.target,
            check=False,
        )  # fmt: skip
        assert same_port.returncode != 0
        assert f"listen: cannot listen on {first.target}: the address is in use" in (
            same_port.stderr
        )

        # The same data directory, another port: refused before the store is
        # opened, naming the directory and the node that holds it.
        same_dir = wheelctl(
            "serve", "--data-dir", str(first.data_dir), "--listen", f"127.0.0.1:{free_port()}",
            check=False,
        )  # fmt: skip
        assert same_dir.returncode != 0
        assert first.proc is not None
        assert (
            f"data directory {first.data_dir.resolve()} is in use by another node"
            f" (pid {first.proc.pid})"
        ) in same_dir.stderr

        # The HTTP listeners are refused the same way (before the node starts).
        listeners = (("--metrics-listen", "metrics_listen"), ("--http-listen", "http_listen"))
        for flag, field in listeners:
            http = wheelctl(
                "serve", "--data-dir", str(tmp_path / field), "--listen",
                f"127.0.0.1:{free_port()}", flag, first.target, check=False,
            )  # fmt: skip
            assert http.returncode != 0
            assert f"{field}: cannot listen on {first.target}" in http.stderr

        # Only the first node answers, every time.
        assert first.healthy()
        assert [_jobs(first.target) for _ in range(6)] == [1] * 6
    finally:
        first.stop()

    # Its lock went with it: a node started on the directory again serves.
    first.start()
    try:
        assert _jobs(first.target) == 1
    finally:
        first.stop()


def test_a_worker_whose_metrics_address_is_in_use_says_so(tmp_path: Path) -> None:
    server = ServerProc(tmp_path / "data")
    server.start()
    try:
        worker = wheelctl(
            "worker", "--target", server.target, "--metrics-listen", server.target,
            "json:dumps", check=False,
        )  # fmt: skip
        assert worker.returncode != 0
        assert f"metrics_listen: cannot listen on {server.target}: Address already in use" in (
            worker.stderr
        )
        assert "Traceback" not in worker.stderr
    finally:
        server.stop()


def test_a_second_node_on_an_sqlite_file_kept_outside_its_data_dir_is_refused(
    tmp_path: Path,
) -> None:
    db = tmp_path / "shared" / "wheel.db"
    db.parent.mkdir()
    first = ServerProc(tmp_path / "first", store=f"sqlite:///{db}")
    first.start()
    try:
        second = wheelctl(
            "serve", "--data-dir", str(tmp_path / "second"), "--store", f"sqlite:///{db}",
            "--listen", f"127.0.0.1:{free_port()}", check=False,
        )  # fmt: skip
        assert second.returncode != 0
        assert first.proc is not None
        assert f"SQLite store {db} is in use by another node (pid {first.proc.pid})" in (
            second.stderr
        )
        assert first.healthy()
    finally:
        first.stop()
