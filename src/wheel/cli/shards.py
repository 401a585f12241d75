"""``wheelctl status --shards``: the shard map, each shard's owner and the
epoch it holds the shard under, as the cluster's members report it.

A node knows the owner of every shard (its view of the coordinator) but the
epoch only of the shards it holds itself. So the map asks the node given,
then each other member it names, and takes each shard's epoch from its
holder's own answer. What an operator debugging a move looks for is said on
the shard's row: a shard no member holds loaded yet (its new owner is still
loading it), one held by a member besides its owner (the old owner has not
heard of the move yet: the store refuses its writes, whose epoch is older),
one with no owner, and an owner that did not answer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from wheel.cli._common import fmt_time
from wheel.client import Status
from wheel.engine.model import SHARD_COUNT

__all__ = ["ShardRow", "gather", "shard_lines", "shard_map"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardRow:
    """One shard: ``owner`` as the asked node routes it ("" while it has
    none); ``epoch``, the owner's own word for the epoch it holds the shard
    under (None: the owner holds it not loaded yet, or did not answer),
    and since when it dispatches it; ``held_by``, every member that says it
    holds the shard, with its epoch."""

    shard: int
    owner: str
    epoch: int | None
    held_by: Mapping[str, int]
    since: datetime | None = None

    def notes(self, answered: Mapping[str, bool]) -> list[str]:
        """What is out of the ordinary about this shard, given which members
        answered (by node id; a node id absent is not a member)."""
        out = []
        others = {n: e for n, e in self.held_by.items() if n != self.owner}
        if not self.owner:
            out.append("no owner")
        elif self.owner not in answered:
            out.append(f"{self.owner} is not a member")
        elif not answered[self.owner]:
            out.append(f"{self.owner} did not answer")
        elif self.epoch is None:
            out.append("not loaded by its owner yet")
        out += [f"also held by {n} at epoch {e}" for n, e in sorted(others.items())]
        return out

    def as_json(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "owner": self.owner,
            "epoch": self.epoch,
            "dispatching_since": self.since.isoformat() if self.since else None,
            "held_by": dict(sorted(self.held_by.items())),
        }


def gather(asked: Status, status_of: Callable[[str], Status | None]) -> dict[str, Status | None]:
    """Each member's answer by node id: ``asked`` for the node that gave it,
    ``status_of(address)`` (with its shard rows; None: no answer) for the
    others it names."""
    answers: dict[str, Status | None] = {asked.node_id: asked}
    for member in asked.nodes:
        if member.node_id not in answers:
            answers[member.node_id] = status_of(member.address) if member.address else None
    return answers


def shard_map(asked: Status, answers: Mapping[str, Status | None]) -> list[ShardRow]:
    """Every shard's row: its owner from ``asked``, the epochs from the
    members' ``answers`` (a row with an epoch is a shard that member holds)."""
    held: dict[int, dict[str, int]] = {}
    since: dict[tuple[int, str], datetime | None] = {}
    for node_id, status in answers.items():
        for s in status.shards if status is not None else ():
            if s.epoch:
                held.setdefault(s.shard, {})[node_id] = s.epoch
                since[s.shard, node_id] = s.dispatching_since
    owners = {s.shard: s.owner for s in asked.shards}
    rows = []
    for shard in range(SHARD_COUNT):
        owner, holders = owners.get(shard, ""), held.get(shard, {})
        rows.append(
            ShardRow(
                shard=shard,
                owner=owner,
                epoch=holders.get(owner),
                held_by=holders,
                since=since.get((shard, owner)),
            )
        )
    return rows


def shard_lines(rows: list[ShardRow], answers: Mapping[str, Status | None]) -> list[str]:
    """The map as ``wheelctl status --shards`` prints it: how many shards
    each member owns, then a row per shard with what is out of the ordinary."""
    answered = {node_id: status is not None for node_id, status in answers.items()}
    owned = Counter(r.owner for r in rows if r.owner)
    lines = [
        "shards: "
        + ", ".join(f"{node} owns {n}" for node, n in sorted(owned.items()))
        + f"; {sum(1 for r in rows if not r.owner)} without an owner"
    ]
    silent = sorted(n for n, ok in answered.items() if not ok)
    if silent:
        lines.append(f"no answer from {', '.join(silent)}: their epochs are unknown")
    width = max([5, *(len(r.owner) for r in rows)])
    lines.append(f"shard  {'owner':<{width}}  epoch  dispatching since")
    for r in rows:
        epoch = "-" if r.epoch is None else str(r.epoch)
        since = fmt_time(r.since)
        notes = r.notes(answered)
        line = f"{r.shard:>5}  {r.owner or '-':<{width}}  {epoch:>5}  {since:<24}"
        lines.append(f"{line}  {'; '.join(notes)}" if notes else line.rstrip())
    return lines
