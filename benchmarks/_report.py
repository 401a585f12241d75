"""What every benchmark does with its result: print it as JSON, and write the
same text to the ``--json`` path when one is given (its folder created: the
output folders are not tracked)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def emit(result: Any, path: str | Path | None) -> None:
    text = json.dumps(result, indent=2)
    print(text)
    if path:
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
