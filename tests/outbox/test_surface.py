"""What importing the transactional submit and the effect helpers costs an
application: no SQLAlchemy unless it passes a SQLAlchemy session."""

from __future__ import annotations

import subprocess
import sys


def test_importing_outbox_and_effects_leaves_sqlalchemy_unimported() -> None:
    code = (
        "import sys, wheel.outbox, wheel.effects, wheel.effects.http;"
        " assert 'sqlalchemy' not in sys.modules, 'sqlalchemy imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_the_public_names_are_exported() -> None:
    from wheel import effects, outbox

    assert {"submit", "submit_many", "fate", "status", "create_table"} <= set(outbox.__all__)
    assert {"record", "hold", "create_table", "StaleFence", "EffectDone"} <= set(effects.__all__)
    for module in (outbox, effects):
        assert all(hasattr(module, name) for name in module.__all__)
