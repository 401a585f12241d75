"""The flags of ``wheelctl submit`` that describe a job (``add_job_flags``):
``update`` takes them too (those given change), and ``import`` takes the
same options as the keys of each line; ``submit_args`` reads them."""

from __future__ import annotations

import argparse

from wheel.cli._common import (
    MAX_PAYLOAD_BYTES,
    ZONELESS_JOB,
    ZONELESS_UTC,
    at_least_one,
)
from wheel.client import CatchUpMode, DstFold, DstGap, OverlapPolicy

__all__ = ["add_job_flags", "priority_arg"]


def add_job_flags(p: argparse.ArgumentParser) -> list[argparse.Action]:
    """The flags of ``wheelctl submit`` that describe the job (``submit_args``
    reads them), and their actions: ``wheelctl import`` takes the same options
    as the keys of each line."""
    return [
        p.add_argument("--name", required=True, help="the job's name (need not be unique)"),
        p.add_argument(
            "--handler",
            help="the handler a worker runs, by its registered name (required without --http-url)",
        ),
        p.add_argument(
            "--http-url",
            help="an HTTP target instead of a handler: each run is one request to this http or"
            " https URL, made by a `wheelctl worker --http`; the payload is its body",
        ),
        p.add_argument(
            "--http-method",
            help="the target's method: GET, POST (the default), PUT, PATCH, DELETE, HEAD, OPTIONS",
        ),
        p.add_argument(
            "--http-header",
            action="append",
            metavar="'NAME: VALUE'",
            help="a header of the target's requests (again for more; on update, the headers"
            " given replace them all)",
        ),
        p.add_argument(
            "--http-timeout",
            help="the target's request timeout, e.g. 10s (30s; at most the job's --timeout)",
        ),
        p.add_argument(
            "--signing-secret",
            help="the name of a secret of the job's tenant (`wheelctl secret`) that signs each"
            " request of the target (Standard Webhooks)",
        ),
        *_switch(
            p,
            (
                "--http-retry-4xx",
                "retry a 4xx of the target like a 5xx (else it fails the run for good)",
            ),
            ("--http-no-retry-4xx", "a 4xx but 408 and 429 fails the run for good (the default)"),
        ),
        *_switch(
            p,
            ("--http-follow-redirects", "follow the target's redirects"),
            ("--http-no-follow-redirects", "a 3xx fails the run, naming its Location (default)"),
        ),
        p.add_argument(
            "--at", help=f"one-shot: +5s (from now), epoch ms, or ISO 8601; {ZONELESS_UTC}"
        ),
        p.add_argument("--cron", help="cron expression (5 fields, or 6 with seconds first)"),
        p.add_argument("--tz", default="UTC", help="IANA time zone of the cron expression"),
        p.add_argument(
            "--dst-gap",
            default=DstGap.FIRE_AT_TRANSITION.value,
            choices=[g.value for g in DstGap],
            help="a cron wall time that does not exist (spring forward): fire once at the"
            " transition (default), or skip it (recorded missed, dst_gap)",
        ),
        p.add_argument(
            "--dst-fold",
            default=DstFold.FIRST.value,
            choices=[f.value for f in DstFold],
            help="a cron wall time that comes twice (fall back): fire on the first (default),"
            " or on both",
        ),
        p.add_argument("--every", help="interval, e.g. 30s (--every=30s works too)"),
        p.add_argument(
            "--start",
            help=f"first fire of an interval: +5s, epoch ms or ISO 8601 (default: now +"
            f" period); {ZONELESS_UTC}",
        ),
        *_switch(
            p,
            ("--fixed-delay", "the next fire an interval after the previous run ends"),
            ("--fixed-rate", "fires an interval apart whatever the runs take (the default)"),
        ),
        p.add_argument(
            "--jitter", help="delay each fire by up to this much, e.g. 10s (never past the next)"
        ),
        p.add_argument(
            "--active-from",
            metavar="DATE",
            help="a recurring job fires at or after this only: RFC 3339 or"
            f" YYYY-MM-DD[THH:MM[:SS]], +DURATION or epoch ms; {ZONELESS_JOB}",
        ),
        p.add_argument(
            "--active-until",
            metavar="DATE",
            help="a recurring job fires at or before this only, then completes once its last"
            f" run ended (as --active-from; 'none' clears it on update); {ZONELESS_JOB}",
        ),
        p.add_argument(
            "--max-fires",
            metavar="N",
            type=int,
            help="a recurring job's fires, run or recorded missed, at most; then it completes"
            " once its last run ended (0: no limit; not with --fixed-delay)",
        ),
        p.add_argument(
            "--payload",
            default="",
            help="the bytes a run gets, as text; @PATH reads them from a file, @- from stdin"
            f" (at most {MAX_PAYLOAD_BYTES} bytes, 256 KiB)",
        ),
        p.add_argument(
            "--payload-json",
            help="a JSON payload, checked to be valid JSON; @PATH or @- reads it from a file"
            " or stdin (at most 256 KiB)",
        ),
        p.add_argument("--tenant", default="default", help="the tenant the job belongs to"),
        p.add_argument("--pool", default="default", help="the worker pool whose workers run it"),
        p.add_argument(
            "--priority",
            type=priority_arg,
            default=5,
            help="0 (runs first) to 9 (runs last) when the pool's workers are short (5); a"
            " waiting run gains a level every --priority-aging of the node (10s)",
        ),
        p.add_argument(
            "--skip-calendar",
            "--skip-calendars",
            dest="skip_calendar",
            action="append",
            metavar="NAME",
            help="do not fire on the days of this calendar of the tenant (wheelctl calendar"
            " set); each such fire is recorded missed, reason calendar. Again for more; on"
            " update, the calendars given replace them all ('' for none)",
        ),
        p.add_argument(
            "--concurrency-key",
            default="",
            metavar="KEY",
            help="a concurrency key of the job's tenant (`wheelctl limit set`): its runs count"
            " against the key's limits across the cluster, and wait for a permit",
        ),
        p.add_argument(
            "--key",
            "--idempotency-key",
            dest="key",
            help="idempotency key: a retried submit"
            " with the same key and body returns the same job",
        ),
        p.add_argument(
            "--catch-up",
            default="run_latest_only",
            choices=[m.value for m in CatchUpMode],
            help="fires missed while down: run the latest only (default), all (up to"
            " --catch-up-max), or skip them (each recorded missed)",
        ),
        p.add_argument(
            "--catch-up-window", help="how late a missed fire may still run, e.g. 1h (default: any)"
        ),
        p.add_argument(
            "--catch-up-max", type=int, default=100, help="run_all: at most this many (100)"
        ),
        p.add_argument(
            "--overlap",
            default="skip",
            choices=[o.value for o in OverlapPolicy],
            help="a fire due while the previous run still goes: skip it (default, recorded"
            " missed), buffer one, buffer all, or allow up to --max-concurrent",
        ),
        p.add_argument(
            "--max-concurrent",
            type=at_least_one,
            default=1,
            help="--overlap allow: runs at once, at most",
        ),
        p.add_argument(
            "--max-attempts",
            type=at_least_one,
            default=5,
            help="attempts of a fire in all, the first included, before it is dead-lettered (5)",
        ),
        p.add_argument(
            "--initial-backoff",
            help="wait before the first retry, e.g. 1s (the default); each retry waits a random"
            " time up to the backoff (full jitter)",
        ),
        p.add_argument(
            "--max-backoff", help="the backoff grows to at most this, e.g. 5m (the default)"
        ),
        p.add_argument(
            "--backoff-multiplier",
            type=_multiplier,
            help="the backoff is multiplied by this after each retry, 1 to 100 (default 2)",
        ),
        p.add_argument("--timeout", default="5m", help="a run's time limit, e.g. 30s (5m)"),
        *_switch(
            p,
            ("--at-most-once", "a run never starts twice (a lost run is not run again)"),
            ("--idempotent", "a lost run is run again (the default)"),
        ),
    ]


def priority_arg(text: str) -> int:
    """--priority: a whole number 0..9."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= value <= 9:
        raise argparse.ArgumentTypeError(f"must be 0 to 9, got {text}")
    return value


def _multiplier(text: str) -> float:
    """--backoff-multiplier: the node takes 1 to 100."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 1.0 <= value <= 100.0:
        raise argparse.ArgumentTypeError(f"must be between 1 and 100, got {text}")
    return value


def _switch(
    p: argparse.ArgumentParser, on: tuple[str, str], off: tuple[str, str]
) -> list[argparse.Action]:
    """A switch and the flag that turns it back off (the default), each with a
    dest of its own (``submit_args`` reads the pair): an update can then
    change it either way, and a line of an import cannot mean the opposite of
    what it says."""
    group = p.add_mutually_exclusive_group()
    return [
        group.add_argument(on[0], action="store_true", help=on[1]),
        group.add_argument(off[0], action="store_true", help=off[1]),
    ]
