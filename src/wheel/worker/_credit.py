"""A worker's capacity, shared between the nodes it holds streams to.

A node hands a worker a run only while the runs the worker holds there are
below the credit the worker gave it: ``Hello.capacity`` plus every
``Credit.add`` since, on that stream. Were each node given the whole capacity,
a worker of three nodes would hold three times its capacity. So the worker
splits it, and keeps this true at every moment::

    capacity >= strays + held on links that are down
                + sum over open links of max(committed, held there)

``committed`` is a link's credit plus every lowering the node has not
confirmed yet: until it answers ``Credit.seq`` with ``Results.credit_seq`` it
may still be handing out runs under the old credit (they are on the stream
ahead of the answer). Raising a credit spends free capacity at once; lowering
one frees capacity only when confirmed. A link whose stream ended commits
nothing: its node sends nothing more on it, and the next stream's Hello
starts afresh.

The split is max-min fair by demand, worked out again on every change of
links, whenever a node uses up its credit, on each confirmation and every
``REBALANCE_S`` while there are several links. A node that used up its credit
in the last ``SATURATED_S`` wants without limit; another wants what it holds
(completions on their way included: it still counts them) plus a probe, so
new work there is taken at once and then shows as demand. What nobody wants
is split evenly: a lone node, or a burst at an idle one, gets it at once. A
busy node that goes idle gives its unused credit back on the next pass, so no
node's share starves while another's idles. With one link the split is the
whole capacity less what other nodes' runs still hold (runs of a link that
went down, completions not yet confirmed), and a Credit is sent only when
that moves the grant by a 32nd of the capacity or more.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wheel.worker._link import Link

__all__ = ["Credits", "fair_shares"]

# How long a node that used up its credit counts as wanting more.
SATURATED_S = 0.5
# How often shares are worked out again while there are several links.
REBALANCE_S = 0.1


def fair_shares(budget: int, demands: Sequence[float]) -> list[int]:
    """Split ``budget`` max-min fairly by ``demands`` (``math.inf``: no
    limit): the smallest demands are met first, each at most an even share
    of what is left; what nobody wants is then split evenly."""
    n = len(demands)
    out = [0] * n
    if n == 0 or budget <= 0:
        return out
    left = budget
    for k, i in enumerate(sorted(range(n), key=lambda i: demands[i])):
        share = left // (n - k)
        give = share if demands[i] >= share else int(demands[i])
        out[i] = give
        left -= give
    if left > 0:
        each, extra = divmod(left, n)
        for i in range(n):
            out[i] += each + (1 if i < extra else 0)
    return out


class Credits:
    """The split of one worker's capacity between its links."""

    def __init__(
        self, capacity: int, links: Sequence[Link], strays_holding: Callable[[], int]
    ) -> None:
        """``links``: the worker's links, as they come and go (read, never
        changed here); ``strays_holding``: how many runs wait for a home
        (they hold a slot of the capacity too)."""
        self.capacity = capacity
        self._links = links
        self._strays_holding = strays_holding
        self._seq = 0
        self._soon: asyncio.Handle | None = None

    def hello_capacity(self, link: Link) -> int:
        """The credit a new stream on ``link`` starts with (its Hello's)."""
        self._reset(link)
        link.open = True
        self.rebalance()
        link.credit_add = link.credit_seq = 0  # said in the Hello instead
        return link.grant

    def closed(self, link: Link) -> None:
        """``link``'s stream ended: it commits nothing any more."""
        self._reset(link)
        self.soon()

    def assigned(self, link: Link) -> None:
        """Runs came on ``link``: if they used up its credit, its node wants more."""
        if link.node_load() >= link.grant:
            now = time.monotonic()
            if now - link.full_at >= SATURATED_S:
                self.soon()  # newly wanting
            link.full_at = now

    def confirmed(self, link: Link, seq: int) -> None:
        """``link``'s node applied every Credit up to ``seq``."""
        done = [s for s in link.reclaims if s <= seq]
        for s in done:
            del link.reclaims[s]
        if done:
            self.soon()

    def soon(self) -> None:
        """Work the shares out again, once, later in this loop turn."""
        if self._soon is None:
            with contextlib.suppress(RuntimeError):  # no loop: nothing runs yet
                self._soon = asyncio.get_running_loop().call_soon(self._run_soon)

    def _run_soon(self) -> None:
        self._soon = None
        self.rebalance()

    async def run(self) -> None:
        """Age demands and hand out capacity freed by completions, while
        there is more than one link to share it with."""
        while True:
            await asyncio.sleep(REBALANCE_S)
            if sum(1 for link in self._links if link.open) > 1:
                self.rebalance()

    def rebalance(self) -> None:
        links = [link for link in self._links if link.open and not link.closed]
        if not links:
            return
        used = self._strays_holding()
        used += sum(len(link.held) for link in self._links if not link.open)
        free = self.capacity - used
        free -= sum(max(link.committed(), len(link.held)) for link in links)
        now = time.monotonic()
        probe = max(1, self.capacity // (4 * len(links)))
        demands = [
            math.inf if now - link.full_at < SATURATED_S else link.node_load() + probe
            for link in links
        ]
        targets = fair_shares(self.capacity - used, demands)
        # Small changes of a big capacity are not worth a message each.
        least = max(1, self.capacity // 32)
        for link, target in zip(links, targets, strict=True):
            if link.grant - target >= least:
                self._seq += 1
                link.reclaims[self._seq] = link.grant - target
                link.credit_add += target - link.grant
                link.credit_seq = self._seq
                link.grant = target
                link.wake.set()
        for link, target in zip(links, targets, strict=True):
            if target <= link.grant or link.reclaims or free <= 0:
                continue
            # Credit up to what it holds costs nothing: those runs are counted.
            held = len(link.held)
            grant = min(target, max(link.grant, held) + free)
            if grant - link.grant < min(least, target - link.grant):
                continue
            free -= max(grant, held) - max(link.grant, held)
            link.credit_add += grant - link.grant
            link.grant = grant
            link.wake.set()

    @staticmethod
    def _reset(link: Link) -> None:
        link.open = False
        link.grant = link.credit_add = link.credit_seq = 0
        link.reclaims.clear()
