"""python -m wheel: the wheelctl command line."""

from wheel.cli import main

raise SystemExit(main())
