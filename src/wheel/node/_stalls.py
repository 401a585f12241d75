"""Where the event loop stood while it stalled (``wheelctl serve
--trace-stalls``): for finding what holds a node's loop, not for every day.

The stall watcher (``Ops._watch_stalls``) beats every 20 ms on the loop. A
thread of this module looks every 5 ms: while the last beat is older than
the threshold, it samples the loop thread's stack and what the node's other
threads are in; once the loop beats again, it logs one record of the stall:
how long, where the loop stood (its commonest stacks), and, on Linux, how
the loop thread spent the time by the kernel's own account
(``/proc/self/task/TID/schedstat``): on a CPU, runnable but waiting for one
(the machine is busier than its cores), or asleep (waiting for the GIL or a
lock, or in a ``select`` that returned late).

The samples need the GIL: a thread that holds it in C code for long shows as
a long gap between samples rather than in a stack.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from types import FrameType

log = logging.getLogger("wheel.node")

SAMPLE_S = 0.005
# Frames kept of the loop's stack, of another thread's, and stacks logged.
LOOP_DEPTH = 12
OTHER_DEPTH = 3
STACKS_LOGGED = 3
OTHERS_LOGGED = 6


def _stack(frame: FrameType | None, depth: int) -> tuple[str, ...]:
    out: list[str] = []
    while frame is not None and len(out) < depth:
        code = frame.f_code
        out.append(f"{os.path.basename(code.co_filename)}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return tuple(out)


class _Stall:
    """What was seen of one stall so far."""

    def __init__(self, began: float, sched: tuple[int, int] | None) -> None:
        self.began = began
        self.sched = sched
        self.loop: Counter[tuple[str, ...]] = Counter()
        self.others: Counter[tuple[str, ...]] = Counter()
        self.longest_gap = 0.0


class StallTracer:
    """Samples the calling thread (the loop's) while ``beat`` is older than
    ``threshold_s``; logs each stall once it is over."""

    def __init__(self, threshold_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        """``clock``: the loop's (``loop.time``), which ``beat`` is read on."""
        self.threshold_s = threshold_s
        self._clock = clock
        # Set by the loop at every beat (a float assignment is atomic).
        self.beat = clock()
        self._loop = threading.get_ident()
        self._schedstat = f"/proc/self/task/{threading.get_native_id()}/schedstat"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wheel-stalls", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _sched(self) -> tuple[int, int] | None:
        """The loop thread's ns on a CPU and ns runnable, waiting for one."""
        try:
            with open(self._schedstat) as f:
                on_cpu, waiting, _ = f.read().split()
        except (OSError, ValueError):
            return None
        return int(on_cpu), int(waiting)

    def _run(self) -> None:
        me = threading.get_ident()
        # The loop thread's accounts of the last moments, to take the one
        # from before a stall's beginning.
        recent: deque[tuple[float, tuple[int, int] | None]] = deque(maxlen=64)
        stall: _Stall | None = None
        last = self._clock()
        while not self._stop.wait(SAMPLE_S):
            now = self._clock()
            recent.append((now, self._sched()))
            beat = self.beat
            if now - beat <= self.threshold_s:
                if stall is not None:
                    self._report(stall, beat, recent[-1][1])
                    stall = None
                last = now
                continue
            if stall is None:
                before = [sched for at, sched in recent if at <= beat]
                stall = _Stall(beat, before[-1] if before else recent[0][1])
            stall.longest_gap = max(stall.longest_gap, now - last)
            last = now
            for ident, frame in sys._current_frames().items():
                if ident == self._loop:
                    stall.loop[_stack(frame, LOOP_DEPTH)] += 1
                elif ident != me:
                    stall.others[_stack(frame, OTHER_DEPTH)] += 1

    def _report(self, stall: _Stall, ended: float, sched: tuple[int, int] | None) -> None:
        stood_ms = (ended - stall.began) * 1000
        samples = sum(stall.loop.values())
        head = f"the event loop stood still for {stood_ms:.0f} ms"
        if stall.sched is not None and sched is not None:
            on_cpu = (sched[0] - stall.sched[0]) / 1e6
            waiting = (sched[1] - stall.sched[1]) / 1e6
            asleep = max(0.0, stood_ms - on_cpu - waiting)
            head += (
                f": the loop thread on a CPU {on_cpu:.0f} ms, waiting for one {waiting:.0f} ms,"
                f" asleep (the GIL, a lock) {asleep:.0f} ms"
            )
        lines = [
            f"{head}; {samples} samples, the longest gap between them"
            f" {stall.longest_gap * 1000:.0f} ms"
        ]
        for stack, n in stall.loop.most_common(STACKS_LOGGED):
            lines.append(f"  the loop, {n} of {samples}:")
            lines.extend(f"    {frame}" for frame in stack)
        for stack, n in stall.others.most_common(OTHERS_LOGGED):
            lines.append(f"  another thread, {n}: {' < '.join(stack)}")
        log.warning("\n".join(lines))
