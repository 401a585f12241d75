"""``wheelctl serve``'s flags reach the node's configuration."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest

from wheel.cli import (
    GC_YOUNG_THRESHOLD,
    SWITCH_INTERVAL_S,
    build_parser,
    serve_config,
    tune_runtime,
)
from wheel.node import NodeConfig


def test_serve_flags_become_the_node_config(tmp_path: Path) -> None:
    ns = build_parser().parse_args(
        [
            "serve",
            "--group-commit-ms", "0",
            "--group-commit-light-ms", "0",
            "--lease-ms", "9000",
            "--node-id", "n7",
        ]
    )  # fmt: skip
    config = serve_config(ns, tmp_path)
    assert config.group_commit_ms == config.group_commit_light_ms == 0
    assert (config.owner.lease_ms, config.node_id) == (9000, "n7")
    assert config.checkpoint_dir == str(tmp_path / "checkpoint")


def test_serve_defaults_are_the_node_defaults(tmp_path: Path) -> None:
    config = serve_config(build_parser().parse_args(["serve", "--no-checkpoint"]), tmp_path)
    assert config.group_commit_ms == NodeConfig().group_commit_ms == 20
    assert config.group_commit_light_ms == NodeConfig().group_commit_light_ms == 5
    assert config.checkpoint_dir is None


def test_a_negative_group_commit_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--group-commit-ms", "-1"])
    assert "negative number of milliseconds" in capsys.readouterr().err


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
