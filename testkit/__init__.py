"""What the tests and the benchmarks share, so that neither imports the other.

``tests`` pins behaviour and ``benchmarks`` measures it; both start real
processes and judge what they did by the same rules. Those parts live here:

- ``promises``: the checker of the promises of ``docs/design.md`` ("The
  promise to users"), numbered as they are there; the simulator
  (``tests/engine/sim.py``) and the nemesis (``benchmarks/chaos.py``) judge
  their histories with it.
- ``services``: free ports, and etcd started for a test or a run.
- ``procs``: ``wheelctl serve`` and worker processes; ``e2e_handlers``: the
  handlers those workers run, which log their effects.
- ``cluster``: a cluster of node processes on etcd and PostgreSQL, with
  links that can be cut.

Not part of ``wheel`` (nothing here ships): the checker is an oracle that
must not share code with what it judges, and the rest starts processes.
``tests/test_layout.py`` fails if ``tests`` imports ``benchmarks`` or the
reverse.
"""
