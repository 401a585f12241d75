"""wheel: a fault-tolerant distributed job scheduler."""

import os as _os

__version__ = "0.1.0"

if _os.environ.get("WHEEL_PURE_PYTHON"):
    # The hot modules from their sources, even where the build compiled them
    # (wheel._compiled).
    from wheel._compiled import use_sources as _use_sources

    _use_sources(_os.environ["WHEEL_PURE_PYTHON"])
