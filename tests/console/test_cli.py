"""``wheelctl serve``'s console flags are refused before anything starts
when they would expose the console, or mean nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from wheel.cli import main


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--http-listen", "0.0.0.0:8080"], "reachable from other machines"),
        (["--http-listen", "localhost"], "is not HOST:PORT"),
        (["--console-actions"], "goes with --http-listen"),
    ],
)
def test_serve_refuses_console_flags_that_expose_it_or_mean_nothing(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["serve", "--data-dir", str(tmp_path / "d"), "--listen", "127.0.0.1:0", *flags])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err
    assert not (tmp_path / "d" / "wheel.db").exists()
