"""``wheelctl``: ``serve``'s flags reach the node's configuration, and the
commands that talk to a node do it through the client SDK."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from testkit.services import free_port
from tests.rpc.test_api import InProcessServer, wait_for
from wheel.cli import build_parser, main
from wheel.cli.serve import (
    GC_YOUNG_THRESHOLD,
    SWITCH_INTERVAL_S,
    app_config,
    cprofile_path,
    serve_config,
    serve_hooks,
    tune_runtime,
)
from wheel.cli.shards import ShardRow, gather, shard_lines, shard_map
from wheel.cli.status import status_lines
from wheel.client import NodeStatus, ShardStatus, Status, UnservedHandler, WorkerStatus
from wheel.engine.model import SHARD_COUNT
from wheel.engine.owner import OwnerConfig
from wheel.node import NodeConfig


def test_serve_flags_become_the_node_config(tmp_path: Path) -> None:
    ns = build_parser().parse_args(
        [
            "serve",
            "--group-commit-ms", "0",
            "--group-commit-light-ms", "0",
            "--burst-batch-claims", "250",
            "--lease-ms", "9000",
            "--node-id", "n7",
        ]
    )  # fmt: skip
    config = serve_config(ns, tmp_path)
    assert config.group_commit_ms == config.group_commit_light_ms == 0
    assert config.burst_batch_claims == 250  # a burst's first part
    assert (config.owner.lease_ms, config.node_id) == (9000, "n7")
    assert config.checkpoint_dir == str(tmp_path / "checkpoint")


def test_serve_defaults_are_the_node_defaults(tmp_path: Path) -> None:
    config = serve_config(build_parser().parse_args(["serve", "--no-checkpoint"]), tmp_path)
    assert config.group_commit_ms == NodeConfig().group_commit_ms == 20
    assert config.group_commit_light_ms == NodeConfig().group_commit_light_ms == 5
    assert config.burst_batch_claims == NodeConfig().burst_batch_claims == 0  # one batch
    assert config.checkpoint_dir is None


def test_serve_flags_become_the_process_config(tmp_path: Path) -> None:
    ns = build_parser().parse_args(
        [
            "serve",
            "--data-dir", str(tmp_path / "d"),
            "--listen", "127.0.0.1:7001",
            "--metrics-listen", "127.0.0.1:7002",
            "--outbox-dsn", "off",
        ]
    )  # fmt: skip
    config = app_config(ns)
    assert config.data_dir == (tmp_path / "d").resolve()
    assert config.store_url == f"sqlite:///{(tmp_path / 'd').resolve() / 'wheel.db'}"
    assert (config.listen, config.metrics_listen) == ("127.0.0.1:7001", "127.0.0.1:7002")
    assert (config.cluster, config.outbox_dsn, config.tls_reload) == (None, None, None)
    assert config.freeze_heap
    # Checked, not acted on: nothing is made on disk.
    assert not (tmp_path / "d").exists()


def test_the_test_hooks_come_from_hidden_flags_not_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The names these hooks once had in the environment are not read.
    monkeypatch.setenv("WHEEL_CLOCK_SKEW_FILE", str(tmp_path / "skew"))
    monkeypatch.setenv("WHEEL_OUTBOX_RECORD_DELAY_S", "9")
    skew = tmp_path / "skew"
    skew.write_text("1500")
    parse = build_parser().parse_args
    hooks = serve_hooks(
        parse(["serve", "--clock-skew-file", str(skew), "--outbox-record-delay", "2.5"])
    )
    assert hooks.clock is not None and hooks.clock.skew_ms == 1500
    assert hooks.outbox_record_delay_s == 2.5
    none = serve_hooks(parse(["serve"]))
    assert (none.clock, none.outbox_record_delay_s) == (None, 0.0)


def test_the_cprofile_switch_is_a_flag_or_its_variable_or_the_old_name() -> None:
    parse = build_parser().parse_args
    assert cprofile_path(parse(["serve", "--cprofile", "/tmp/a.prof"]), {}) == "/tmp/a.prof"
    assert cprofile_path(parse(["serve"]), {"WHEEL_CPROFILE": "/tmp/b.prof"}) == "/tmp/b.prof"
    assert cprofile_path(parse(["serve"]), {"WHEEL_PROFILE": "/tmp/c.prof"}) == "/tmp/c.prof"
    assert cprofile_path(parse(["serve"]), {}) is None


def _imported(code: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a fresh interpreter has imported after ``code``."""
    probe = f"{code}\nimport sys\nprint([m for m in {modules!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return list(json.loads(out.stdout.replace("'", '"')))


def test_building_the_parser_imports_no_part_of_the_node() -> None:
    """Every wheelctl command builds the whole parser, ``serve``'s flags
    included: that must not import the node, the owner, the checkpoint or a
    store backend (it cost a third of a second a call)."""
    heavy = ("wheel.node", "wheel.engine.owner", "wheel.checkpoint", "wheel.store.postgres")
    assert _imported("from wheel.cli import build_parser\nbuild_parser()", heavy) == []


def test_a_single_node_does_not_load_the_etcd_client() -> None:
    code = "import wheel.node, wheel.rpc.server\nfrom wheel.coord import Coordinator"
    assert _imported(code, ("etcd3", "wheel.coord.etcd")) == []
    named = "from wheel.coord import EtcdCoordinator"
    assert _imported(named, ("etcd3", "wheel.coord.etcd")) == ["etcd3", "wheel.coord.etcd"]


def test_a_negative_group_commit_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--group-commit-ms", "-1"])
    assert "negative number of milliseconds" in capsys.readouterr().err


def test_a_worker_takes_a_target_per_node_of_a_cluster() -> None:
    ns = build_parser().parse_args(
        ["worker", "--target", "10.0.0.1:50051", "--target", "10.0.0.2:50051", "m:f"]
    )
    assert ns.target == ["10.0.0.1:50051", "10.0.0.2:50051"]
    # None: WHEEL_TARGET, else the default address.
    assert build_parser().parse_args(["worker", "m:f"]).target is None


def test_serve_lets_a_runs_objects_die_young_and_hands_the_gil_on_sooner() -> None:
    before = gc.get_threshold()
    switch = sys.getswitchinterval()
    try:
        tune_runtime()
        young, middle, old = gc.get_threshold()
        assert young == GC_YOUNG_THRESHOLD > 10 * before[0]
        assert (middle, old) == before[1:]
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
        assert switch / 10 > SWITCH_INTERVAL_S
    finally:
        gc.set_threshold(*before)
        sys.setswitchinterval(switch)


def _status(**kw: Any) -> Status:
    fields: dict[str, Any] = {
        "node_id": "node-1",
        "nodes": [NodeStatus(node_id="node-1", address="", shards_owned=256)],
        "shards": [],
        "jobs": 12,
        "pending_timers": 10,
        "in_flight": 2,
        "backlog": 5,
        "overdue_backlog": 1,
        "workers": 2,
        "worker_capacity": 12,
        "dispatch_lag_p50": timedelta(milliseconds=1.5),
        "dispatch_lag_p99": timedelta(milliseconds=20),
        "dispatched_total": 100,
        "completed_total": 97,
        "missed_total": 3,
        "dead_lettered_total": 0,
        "reaper_paused": False,
        "worker_list": [],
        "unserved": [],
        "alerts_firing": [],
    }
    return Status(**{**fields, **kw})


def test_status_shows_each_worker_its_handlers_and_each_handler_no_worker_runs() -> None:
    lines = status_lines(
        _status(
            worker_list=[
                WorkerStatus(
                    worker_id="w-a",
                    capacity=8,
                    held=3,
                    pools=["default"],
                    handlers=["send_report", "flaky"],
                    draining=False,
                    silent=False,
                ),
                WorkerStatus(
                    worker_id="w-b",
                    capacity=4,
                    held=0,
                    pools=["default", "gpu"],
                    handlers=[],
                    draining=True,
                    silent=True,
                ),
            ],
            unserved=[UnservedHandler(pool="gpu", handler="train", waiting=9)],
        )
    )
    text = "\n".join(lines)
    assert "dispatch lag p50 1.5 ms p99 20.0 ms" in text
    assert "workers: 2, capacity 12" in lines
    assert "  w-a  held 3/8  pools default  handlers send_report, flaky" in lines
    assert "  w-b  held 0/4  pools default,gpu  handlers (any)  draining  silent" in lines
    assert lines[-1] == "no worker for handler train in pool gpu: 9 waiting"
    assert "paused" not in text
    assert "re-dispatch of lost runs is paused" in "\n".join(
        status_lines(_status(reaper_paused=True))
    )


def test_wheelctl_talks_to_a_node_through_the_client(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = InProcessServer(tmp_path).start()
    try:
        target = ["--target", server.target]
        assert main(["submit", *target, "--name", "hourly", "--handler", "h", "--every", "1h",
                     "--catch-up", "skip", "--max-attempts", "3", "--json"]) == 0  # fmt: skip
        job_id = json.loads(capsys.readouterr().out)["job_id"]
        assert main(["submit", *target, "--name", "soon", "--handler", "h", "--at", "+1h"]) == 0
        assert capsys.readouterr().out.startswith("submitted job ")
        assert main(["jobs", *target]) == 0
        listed = capsys.readouterr().out
        assert "hourly" in listed and "soon" in listed and str(job_id) in listed
        assert main(["trigger", str(job_id), *target]) == 0
        assert f"triggered job {job_id}: fire " in capsys.readouterr().out
        assert main(["pause", str(job_id), *target]) == 0
        assert " paused " in capsys.readouterr().out
        assert main(["runs", str(job_id), *target, "--json"]) == 0
        runs = json.loads(capsys.readouterr().out)
        assert [(r["run_id"] > 0, r["attempt"]) for r in runs] == [(True, 1)]
        assert set(runs[0]) == {"run_id", "scheduled_for_ms", "attempt", "state", "fence",
                                "worker_id", "error", "missed_reason", "dispatched_at_ms",
                                "started_at_ms", "finished_at_ms", "duration_ms",
                                "result"}  # fmt: skip
        assert runs[0]["result"] is None  # a run in flight left none yet
        assert main(["status", *target]) == 0
        status = capsys.readouterr().out
        assert status.startswith("node node-1: 2 jobs") and "workers: 0, capacity 0" in status
        assert main(["status", *target, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["node_id"] == "node-1"
        # One node: every shard its own, under the epoch it holds it with.
        node = server.node
        assert node is not None
        held = server.call(node.status)
        epochs, since = held.shards, held.dispatching_since
        assert main(["status", *target, "--shards"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert "shards: node-1 owns 256; 0 without an owner" in out
        # Each since the node started: dispatched under its epoch since then.
        # Its time as every time wheelctl prints: UTC, with its Z.
        started = datetime.fromtimestamp(since[0] / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")
        started = started[:-3] + "Z"
        assert set(since.values()) == {since[0]}
        assert out[-SHARD_COUNT:] == [
            f"{s:>5}  node-1  {epochs[s]:>5}  {started}" for s in range(SHARD_COUNT)
        ]
        # The client's checks come back as wheelctl's errors, naming the flag.
        assert main(["submit", *target, "--name", "x", "--handler", "h", "--every", "5s",
                     "--tz", "Europe/Paris"]) == 2  # fmt: skip
        assert "tz: goes with cron= only" in capsys.readouterr().err
    finally:
        server.stop()


def test_wheelctl_takes_several_comma_separated_targets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = InProcessServer(tmp_path).start()
    try:
        # The first address has no node: every command goes on to the second.
        target = ["--target", f"127.0.0.1:{free_port()},{server.target}"]
        assert main(["submit", *target, "--name", "n", "--handler", "h", "--at", "+1h",
                     "--json"]) == 0  # fmt: skip
        job_id = json.loads(capsys.readouterr().out)["job_id"]
        assert main(["trigger", str(job_id), *target]) == 0
        assert f"triggered job {job_id}" in capsys.readouterr().out
        assert main(["status", *target]) == 0
        assert capsys.readouterr().out.startswith("node node-1: 1 jobs")
        ns = build_parser().parse_args(["worker", "m:f", *target])
        assert ns.target == [target[1]]  # the worker splits it into its nodes
    finally:
        server.stop()


DAY_MS = 86_400_000


def test_serve_and_worker_take_the_operations_flags(tmp_path: Path) -> None:
    parse = build_parser().parse_args
    ns = parse(["serve", "--metrics-listen", ":9100", "--retain", "7d", "--log-format", "json",
                "--retention-interval", "90s"])  # fmt: skip
    assert (ns.metrics_listen, ns.log_format) == (":9100", "json")
    assert serve_config(ns, tmp_path).retain_ms == 7 * DAY_MS
    assert serve_config(ns, tmp_path).retention_interval_s == 90.0
    defaults = parse(["serve"])
    assert serve_config(defaults, tmp_path).retain_ms == 30 * DAY_MS == NodeConfig().retain_ms
    assert serve_config(defaults, tmp_path).retention_interval_s == 600.0
    assert serve_config(defaults, tmp_path).statistics_interval_s == 60.0
    for flag, seconds in (("5m", 300.0), ("off", 0.0)):
        told = parse(["serve", "--statistics-interval", flag])
        assert serve_config(told, tmp_path).statistics_interval_s == seconds
    assert serve_config(defaults, tmp_path).trace_stalls_s == 0.0 == NodeConfig().trace_stalls_s
    for flag, seconds in (("250ms", 0.25), ("off", 0.0)):
        told = parse(["serve", "--trace-stalls", flag])
        assert serve_config(told, tmp_path).trace_stalls_s == seconds
    assert (defaults.metrics_listen, defaults.log_format) == (None, "text")
    assert serve_config(parse(["serve", "--retain", "forever"]), tmp_path).retain_ms is None
    worker = parse(["worker", "m:f", "--metrics-listen", "127.0.0.1:9101", "--log-format", "json"])
    assert (worker.metrics_listen, worker.log_format) == ("127.0.0.1:9101", "json")


@pytest.mark.parametrize("value", ["0s", "30", "soon"])
@pytest.mark.parametrize("flag", ["--retain", "--retention-interval"])
def test_a_retention_that_is_not_a_positive_duration_is_refused(flag: str, value: str) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", flag, value])


def test_status_names_the_alerts_firing() -> None:
    lines = status_lines(_status(alerts_firing=["no_worker", "lag_slo"]))
    assert lines[-1] == "alerts firing: no_worker, lag_slo (wheelctl alerts)"
    assert not any("alerts firing" in line for line in status_lines(_status()))


def test_wheelctl_alerts_lists_what_the_node_raised(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = InProcessServer(tmp_path, OwnerConfig(unserved_alert_ms=100)).start()
    try:
        target = ["--target", server.target]
        assert main(["submit", *target, "--name", "n", "--handler", "nobody", "--at", "+0s"]) == 0
        capsys.readouterr()

        def listed() -> dict[str, Any]:
            assert main(["alerts", *target, "--json"]) == 0
            out: dict[str, Any] = json.loads(capsys.readouterr().out)
            return out

        out = wait_for(lambda: (a := listed())["alerts"] and a, 10, "the no-worker alert")
        assert out["firing"] == ["no_worker"]
        [alert] = out["alerts"]
        assert alert["kind"] == "no_worker" and "'nobody'" in alert["message"]
        assert alert["node_id"] == "node-1" and alert["at_ms"] > 0
        assert main(["alerts", *target, "--since", "1h"]) == 0
        text = capsys.readouterr().out.splitlines()
        assert text[0] == "firing: no_worker"
        assert "no_worker" in text[1] and "'nobody'" in text[1]
        assert main(["status", *target]) == 0
        assert "alerts firing: no_worker" in capsys.readouterr().out
    finally:
        server.stop()


def test_the_shard_map_says_what_is_moving_held_twice_or_unknown() -> None:
    def member(node_id: str) -> NodeStatus:
        return NodeStatus(node_id=node_id, address=f"{node_id}:1", shards_owned=0)

    def row(shard: int, owner: str, epoch: int = 0) -> ShardStatus:
        since = datetime(2026, 3, 1, 4, 5, 6, 789_000, tzinfo=UTC) if epoch else None
        return ShardStatus(
            shard=shard, owner=owner, epoch=epoch, jobs=0, in_flight=0, dispatching_since=since
        )

    # As node-a sees it: shard 1 moved to node-b, which node-a still holds;
    # node-b is loading shard 2; node-c does not answer; node-d is gone.
    a = _status(
        node_id="node-a",
        nodes=[member("node-a"), member("node-b"), member("node-c")],
        shards=[row(0, "node-a", 3), row(1, "node-b", 4), row(2, "node-b"),
                row(3, "node-c"), row(5, "node-d")],
    )  # fmt: skip
    b = _status(node_id="node-b", shards=[row(0, "node-a"), row(1, "node-b", 5)])
    asked: list[str] = []

    def status_of(address: str) -> Status | None:
        asked.append(address)
        return b if address == "node-b:1" else None

    answers = gather(a, status_of)
    assert asked == ["node-b:1", "node-c:1"]
    assert answers == {"node-a": a, "node-b": b, "node-c": None}
    rows = shard_map(a, answers)
    assert len(rows) == SHARD_COUNT
    since = datetime(2026, 3, 1, 4, 5, 6, 789_000, tzinfo=UTC)
    assert rows[1] == ShardRow(
        shard=1, owner="node-b", epoch=5, held_by={"node-b": 5, "node-a": 4}, since=since
    )
    assert rows[2].epoch is None and rows[2].held_by == {}
    lines = shard_lines(rows, answers)
    assert lines[:3] == [
        "shards: node-a owns 1, node-b owns 2, node-c owns 1, node-d owns 1; 251 without an owner",
        "no answer from node-c: their epochs are unknown",
        "shard  owner   epoch  dispatching since",
    ]
    assert lines[3:9] == [
        "    0  node-a      3  2026-03-01T04:05:06.789Z",
        "    1  node-b      5  2026-03-01T04:05:06.789Z  also held by node-a at epoch 4",
        "    2  node-b      -  -                         not loaded by its owner yet",
        "    3  node-c      -  -                         node-c did not answer",
        "    4  -           -  -                         no owner",
        "    5  node-d      -  -                         node-d is not a member",
    ]
    assert rows[1].as_json() == {
        "shard": 1,
        "owner": "node-b",
        "epoch": 5,
        "dispatching_since": "2026-03-01T04:05:06.789000+00:00",
        "held_by": {"node-a": 4, "node-b": 5},
    }
