"""``wheelctl import FILE``: many jobs from a JSON Lines file, one submit a line.

wheelctl import jobs.jsonl [--batch N] [--parallel N] [--errors PATH] [--json]

Each line is a JSON object whose keys are the job options of ``wheelctl
submit`` (``wheel.cli.add_job_flags``), ``-`` spelled ``_``:
``{"name": "report-7", "handler": "send_report", "cron": "0 2 * * *",
"catch_up": "skip", "payload": {"id": 7}}``. A value is what the flag takes:
a string, a number for a numeric flag (and for ``at`` and ``start``, epoch
milliseconds), true or false for a switch; ``payload`` may be any JSON value
(a string is sent as its text, anything else as compact JSON), and
``payload_json`` JSON text, checked (or any other JSON value, sent as compact
JSON); ``@PATH`` is not read in a line (it is the payload's text). The same
``submit_args`` as ``wheelctl submit``'s makes the request. Blank lines are
skipped; relative times (``+5s``) count from the start of the import.

Lines go to the node in batches through ``Client.submit_many``, a few calls
in flight from threads, while the next batch is read.

**Nothing is created twice by an import run again** (after a node crashed,
or the import itself): every line is sent with an idempotency key, its own
(``idempotency_key``, or ``key`` as the flag spells it) or else
``derived_key``'s ``import-N-DIGEST``, from the line's number and text. A node
answers a key it already holds, with the same body, with the job it made
("already existed"). So a re-run must see the same lines at the same line
numbers; and a line with a relative time sends another time, that is another
body, on each run: its key then answers "used with a different request".

A job with an HTTP target takes an ``http`` object instead of a handler:
``{"name": "ping", "cron": "*/5 * * * *", "http": {"url":
"https://example.com/hook", "method": "POST", "headers": {"X-Team": "ops"},
"timeout": "10s", "signing_secret": "hooks", "retry_4xx": false,
"follow_redirects": false}, "payload": {"id": 7}}`` (the payload is the
request's body); the target's flags as keys (``http_url``...) work too.
``skip_calendars`` (or ``skip_calendar``) takes a calendar's name or an
array of them: ``{"name": "r", "handler": "h", "cron": "0 9 * * *",
"skip_calendars": ["holidays", "weekend"]}``.

A bad line (not JSON, an unknown key, a bad value, a request the node
refuses) is reported with its number and reason and holds back no other. A
call that fails as a whole with UNAVAILABLE or DEADLINE_EXCEEDED is sent again
with backoff, which the keys make safe, for up to ``--retry-for``; so is a
line the node answered UNAVAILABLE for (its store failed that batch). A call
still failing after that, or failing as a whole with any other error, stops
the import: it was not about a line, and every later call would meet it too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any, TextIO

from wheel._retry import Backoff, Jitter
from wheel.cli._common import parse_duration, submit_args
from wheel.cli._jobflags import add_job_flags
from wheel.cli.admin import add_token_flag
from wheel.cli.codec import add_codec_flag, codec_of
from wheel.client import Client, Job, JobRequest
from wheel.errors import InvalidArgument, WheelError
from wheel.tls import client_security

# ``Client.submit_many`` (and the node) take at most this many jobs a call.
MAX_BATCH = 10_000
# Lines' text in one call, at most. A node takes a request of up to 64 MiB;
# a spec takes about as many bytes on the wire as its JSON line, and the
# answer to a bulk submit leaves the specs out (``SubmitJobsRequest.lean``).
MAX_BATCH_BYTES = 16 << 20
# Codes a whole call may fail with that say nothing about its lines: the node
# went away or was slow to answer. The client raises them as a plain
# ``WheelError`` starting with the code's name.
RETRYABLE = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"})
# How often the progress is shown: redrawn on a terminal, a line elsewhere.
BAR_EVERY_S = 0.2
LINE_EVERY_S = 5.0
BAR_WIDTH = 30
# Why an import stopped at Ctrl-C.
INTERRUPTED = "interrupted"


def derived_key(number: int, text: str) -> str:
    """The idempotency key of line ``number`` that gives none of its own:
    ``import-N-`` and the first 32 hex digits of the SHA-256 of the line's
    text (without its surrounding whitespace). The same line at the same
    number in another run gets the same key; an edited line, a new one."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:32]
    return f"import-{number}-{digest}"


def retryable(exc: WheelError) -> bool:
    """Whether a failure is one to try again (see ``RETRYABLE``)."""
    return type(exc) is WheelError and str(exc).partition(":")[0] in RETRYABLE


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "true or false"}
    for kind, name in names.items():
        if isinstance(value, kind):
            return name
    return "null" if value is None else "a number"


class LineParser:
    """A line's ``JobRequest``, made as ``wheelctl submit`` makes one from its
    flags: the line's keys are looked up among the same flags, their values
    converted and checked by the flags' own types and choices, and the result
    goes through ``submit_args``. Raises ``WheelError`` with the reason."""

    __slots__ = ("_defaults", "_flags", "_now", "_required")

    def __init__(self, now: datetime) -> None:
        actions = add_job_flags(argparse.ArgumentParser(add_help=False))
        # Every spelling of a flag: "key" and "idempotency_key" are one option.
        self._flags = {
            option.lstrip("-").replace("-", "_"): action
            for action in actions
            for option in action.option_strings
        }
        self._defaults = {action.dest: action.default for action in actions}
        self._required = [action.dest for action in actions if action.required]
        self._now = now

    def request(self, number: int, text: str) -> JobRequest:
        try:
            line = json.loads(text)
        except json.JSONDecodeError as exc:
            raise WheelError(f"not JSON: {exc.msg} at column {exc.colno}") from None
        if not isinstance(line, dict):
            raise WheelError(f"not a JSON object but {_json_type(line)}")
        values = dict(self._defaults)
        given: dict[str, str] = {}
        for key, value in _flat(line).items():
            action = self._flags.get(key.replace("-", "_"))
            if action is None:
                raise InvalidArgument(key, "is not an option of wheelctl submit")
            if action.dest in given:
                raise InvalidArgument(key, f"is the same option as {given[action.dest]}")
            given[action.dest] = key
            if value is not None:  # null: the flag's default
                values[action.dest] = _flag_value(action, key, value)
        for dest in self._required:
            if values[dest] is None:
                raise InvalidArgument(dest, "is required")
        args = submit_args(argparse.Namespace(**values), now=self._now, files=False)
        args["idempotency_key"] = args.get("idempotency_key") or derived_key(number, text)
        return JobRequest(**args)


# The keys of a line's ``http`` object, and the flag each stands for.
_HTTP_KEYS = {
    "url": "http_url",
    "method": "http_method",
    "headers": "http_header",
    "timeout": "http_timeout",
    "signing_secret": "signing_secret",
    "retry_4xx": "http_retry_4xx",
    "follow_redirects": "http_follow_redirects",
}


def _flat(line: dict[str, Any]) -> dict[str, Any]:
    """A line with its ``http`` object (``{"url": ..., "method": ...,
    "headers": {...}, "timeout": "10s", "signing_secret": ...}``) spelled as
    the target's own flags (``http_url``...)."""
    target = line.get("http")
    if "http" not in line or target is None:
        return {k: v for k, v in line.items() if k != "http"}
    if not isinstance(target, dict):
        raise InvalidArgument("http", f"expected an object, got {_json_type(target)}")
    out = {k: v for k, v in line.items() if k != "http"}
    for key, value in target.items():
        flag = _HTTP_KEYS.get(key)
        if flag is None:
            raise InvalidArgument(f"http.{key}", f"is not one of {', '.join(_HTTP_KEYS)}")
        if flag in out:
            raise InvalidArgument(f"http.{key}", f"is the same option as {flag}")
        out[flag] = value
    return out


def _headers(value: object) -> list[str]:
    """A line's headers: ``{"Name": "value"}``, ``["Name: value", ...]`` or
    one ``"Name: value"``, as ``--http-header`` values."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [f"{k}: {v}" for k, v in value.items()]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise InvalidArgument("http_header", "expected an object of names and values")


def _names(key: str, value: object) -> list[str]:
    """A line's calendars: ``["holidays", ...]`` or one ``"holidays"``."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise InvalidArgument(key, "expected a calendar's name or an array of them")


def _flag_value(action: argparse.Action, key: str, value: object) -> object:
    """What the flag would hold had ``value`` been given on the command line."""
    if action.dest == "http_header":
        return _headers(value)
    if action.dest == "skip_calendar":
        return _names(key, value)
    if action.nargs == 0:  # a switch: --fixed-delay, --at-most-once
        if not isinstance(value, bool):
            raise InvalidArgument(key, f"expected true or false, got {_json_type(value)}")
        return value
    if action.dest == "payload":
        return value  # any JSON value: the client knows how to send each (Payload)
    if action.dest == "payload_json" and not isinstance(value, str):
        return json.dumps(value, separators=(",", ":"))  # the value itself, not JSON text
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise InvalidArgument(key, f"expected a string or a number, got {_json_type(value)}")
    text = value if isinstance(value, str) else json.dumps(value)
    convert = action.type if callable(action.type) else str
    try:
        out = convert(text)
    except argparse.ArgumentTypeError as exc:
        raise InvalidArgument(key, str(exc)) from None
    except (TypeError, ValueError):
        kind = "a whole number" if convert is int else "valid"
        raise InvalidArgument(key, f"{text!r} is not {kind}") from None
    if action.choices is not None and out not in action.choices:
        raise InvalidArgument(key, f"{out!r} is not one of {', '.join(map(str, action.choices))}")
    return out


# -- batches ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Batch:
    """Good lines to send in one call: their numbers, texts and requests, and
    the bytes they took in the file (for the progress)."""

    numbers: tuple[int, ...]
    texts: tuple[str, ...]
    requests: tuple[JobRequest, ...]
    size: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Sent:
    """What became of a batch: by index in it, the job or the error of each
    line the node answered for (the others are not known to be in: the
    import stopped first); and, when this batch stopped the import, why."""

    results: dict[int, Job | WheelError]
    stopped: str | None = None


def retry_backoff(budget_s: float) -> Backoff:
    """How a call is tried again: after a wait of full jitter (the batches of
    a parallel import fail together), doubling from 0.25 s up to 5 s, until
    ``budget_s`` after its first failure."""
    return Backoff(initial=0.25, max=5.0, jitter=Jitter.FULL, deadline=budget_s)


class Sender:
    """Sends the batches of one import through ``client``, from any thread:
    each until every line has an answer that is not UNAVAILABLE or
    DEADLINE_EXCEEDED, the backoff's budget is spent, or ``stop`` is set.
    ``on_retry`` hears each failure that is tried again."""

    __slots__ = ("_backoff", "_client", "_on_retry", "_rng", "stop")

    def __init__(self, client: Client, backoff: Backoff, on_retry: Callable[[str], None]) -> None:
        self._client = client
        self._backoff = backoff
        self._on_retry = on_retry
        self._rng = random.Random()
        self.stop = threading.Event()

    def send(self, batch: Batch) -> Sent:
        sent = self._send(batch)
        if sent.stopped is not None:
            self.stop.set()  # the others, at once: a call still waiting would hold them
        return sent

    def _send(self, batch: Batch) -> Sent:
        results: dict[int, Job | WheelError] = {}
        pending = list(range(len(batch.requests)))
        delays = self._backoff.delays(rng=self._rng)
        while True:
            whole: WheelError | None = None
            try:
                answers = self._client.submit_many([batch.requests[i] for i in pending])
            except WheelError as exc:
                if not retryable(exc):
                    if len(batch.requests) == 1:  # the call was that line's alone
                        return Sent(results={0: exc})
                    return _unsent(results, pending, stopped=str(exc))
                whole, again = exc, pending
            else:
                again = []
                for i, answer in zip(pending, answers, strict=True):
                    results[i] = answer
                    if isinstance(answer, WheelError) and retryable(answer):
                        again.append(i)
            if not again:
                return Sent(results=results)
            delay = delays.next()
            if delay is None:
                if whole is None:  # the node answered: these lines failed, with its reason
                    return Sent(results=results)
                retried = f"{whole} (retried for {delays.failing_for:.1f} s)"
                return _unsent(results, again, stopped=retried)
            self._on_retry(str(whole if whole is not None else results[again[0]]))
            if self.stop.wait(delay):  # another batch stopped the import, or Ctrl-C did
                return _unsent(results, again)
            pending = again


def _unsent(
    results: dict[int, Job | WheelError], unsent: list[int], stopped: str | None = None
) -> Sent:
    """A batch whose lines ``unsent`` are not known to be in: not failed either
    (an earlier answer for one of them was an error tried again)."""
    for i in unsent:
        results.pop(i, None)
    return Sent(results=results, stopped=stopped)


# -- what the user sees -----------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    """The end of an import: non-blank lines read; jobs created; lines whose
    key and body the node already held (their job existed); lines failed;
    lines read and not sent, or sent and not answered (the import stopped
    first); whether the whole file was read; why the import stopped early."""

    source: str
    lines: int
    created: int
    existed: int
    failed: int
    unsent: int
    complete: bool
    stopped: str | None
    elapsed_s: float

    @property
    def jobs_per_s(self) -> float:
        return (self.created + self.existed) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def ok(self) -> bool:
        """Every line of the file went in."""
        return self.complete and not (self.failed or self.unsent or self.stopped)

    def text(self) -> str:
        unsent = f", {self.unsent:,} not sent" if self.unsent else ""
        rest = "" if self.complete else f"; the rest of {self.source} was not read"
        return (
            f"read {self.lines:,} line{'' if self.lines == 1 else 's'} from {self.source}:"
            f" {self.created:,} created,"
            f" {self.existed:,} already existed, {self.failed:,} failed{unsent}{rest};"
            f" {self.elapsed_s:.1f} s, {self.jobs_per_s:,.0f} jobs/s"
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "file": self.source,
            "lines": self.lines,
            "created": self.created,
            "existed": self.existed,
            "failed": self.failed,
            "unsent": self.unsent,
            "complete": self.complete,
            "stopped": self.stopped,
            "elapsed_s": round(self.elapsed_s, 3),
            "jobs_per_s": round(self.jobs_per_s, 1),
        }


def progress_text(
    *,
    lines: int,
    done: int,
    failed: int,
    fraction: float | None,
    elapsed_s: float,
    bar: bool,
    retrying: str | None = None,
) -> str:
    """One look at an import going on: ``done`` lines are in, of ``lines``
    read; ``fraction`` of the file is settled (None: its size is unknown);
    ``retrying``: the failure a call is being retried for."""
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    parts = [f"{lines:,} lines read", f"{done:,} in", f"{failed:,} failed", f"{rate:,.0f} jobs/s"]
    if fraction is not None:
        # Too early to tell before a hundredth of the file has settled.
        eta = elapsed_s * (1 - fraction) / fraction if fraction >= 0.01 else None
        parts.append("eta -" if eta is None else f"eta {eta:.0f}s")
    if retrying is not None:
        parts.append(f"retrying: {retrying[:60]}")
    text = "  ".join(parts)
    if fraction is None:
        return text if bar else f"import: {text}"
    if not bar:
        return f"import: {fraction:.0%}  {text}"
    filled = round(BAR_WIDTH * fraction)
    return f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {fraction:4.0%}  {text}"


class Report:
    """The counts of an import and what it tells as it goes: each bad line as
    ``FILE:N: reason`` on stderr (and as JSON in the errors file), and the
    progress, a bar redrawn on a terminal or a line now and then elsewhere.
    The reading thread and the threads sending batches share it."""

    def __init__(
        self,
        *,
        source: str,
        total_bytes: int | None,
        err: TextIO,
        tty: bool,
        errors: TextIO | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.total_bytes = total_bytes
        self._err = err
        self._tty = tty
        self._errors = errors
        self._clock = clock
        self._started = clock()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._ticker: threading.Thread | None = None
        self._drawn = False
        self._retrying: str | None = None
        self._retrying_until = 0.0
        self.lines = self.created = self.existed = self.failed = 0
        self.done_bytes = 0
        self.complete = False
        self.stopped: str | None = None

    def start(self) -> None:
        every = BAR_EVERY_S if self._tty else LINE_EVERY_S
        self._ticker = threading.Thread(
            target=self._tick, args=(every,), name="wheel-import-progress", daemon=True
        )
        self._ticker.start()

    def _tick(self, every: float) -> None:
        while not self._closed.wait(every):
            with self._lock:
                self._show()

    def _show(self) -> None:
        fraction = None
        if self.total_bytes:
            fraction = min(1.0, self.done_bytes / self.total_bytes)
        text = progress_text(
            lines=self.lines,
            done=self.created + self.existed,
            failed=self.failed,
            fraction=fraction,
            elapsed_s=self._clock() - self._started,
            bar=self._tty,
            retrying=self._retrying if self._clock() < self._retrying_until else None,
        )
        if self._tty:
            self._err.write(f"\r{text}\x1b[K")
            self._drawn = True
        else:
            self._err.write(text + "\n")
        self._err.flush()

    def _clear(self) -> None:
        if self._drawn:
            self._err.write("\r\x1b[K")
            self._drawn = False

    def read(self, size: int, *, line: bool) -> None:
        """A line was read: ``size`` bytes; ``line`` unless it was blank."""
        with self._lock:
            self.lines += line
            if not line:
                self.done_bytes += size

    def fail(self, number: int, reason: str, text: str, size: int = 0) -> None:
        """Line ``number`` is bad (``size``: bytes of it not yet settled)."""
        with self._lock:
            self.failed += 1
            self.done_bytes += size
            self._clear()
            self._err.write(f"{self.source}:{number}: {reason}\n")
            if self._errors is not None:
                self._errors.write(json.dumps({"line": number, "error": reason, "text": text}))
                self._errors.write("\n")

    def settle(self, batch: Batch, sent: Sent) -> None:
        """Count what became of a batch; report its lines that failed."""
        for i, outcome in sent.results.items():
            if isinstance(outcome, WheelError):
                self.fail(batch.numbers[i], str(outcome), batch.texts[i])
        with self._lock:
            for outcome in sent.results.values():
                if isinstance(outcome, Job):
                    self.created += outcome.created
                    self.existed += not outcome.created
            self.done_bytes += batch.size
            if sent.stopped is not None and self.stopped is None:
                self.stopped = sent.stopped

    def retrying(self, reason: str) -> None:
        """A call failed for ``reason`` and is tried again: the progress says
        so for a while, or a node that went away would look like a hang."""
        with self._lock:
            self._retrying = reason
            self._retrying_until = self._clock() + 2 * LINE_EVERY_S

    def stop(self, reason: str) -> None:
        with self._lock:
            self.stopped = self.stopped or reason

    def close(self) -> Summary:
        self._closed.set()
        if self._ticker is not None:
            self._ticker.join()
        with self._lock:
            self._clear()
            self._err.flush()
            return Summary(
                source=self.source,
                lines=self.lines,
                created=self.created,
                existed=self.existed,
                failed=self.failed,
                # Read, but neither in nor failed: sent when the import
                # stopped and not answered, or not sent at all.
                unsent=self.lines - self.created - self.existed - self.failed,
                complete=self.complete,
                stopped=self.stopped,
                elapsed_s=self._clock() - self._started,
            )


# -- reading ------------------------------------------------------------------------


def batches(
    stream: Iterable[bytes],
    parser: LineParser,
    report: Report,
    *,
    max_lines: int,
    max_bytes: int = MAX_BATCH_BYTES,
) -> Iterator[Batch]:
    """The good lines of ``stream`` in batches of at most ``max_lines`` lines
    and ``max_bytes`` bytes (a longer line goes alone); blank lines skipped,
    bad ones reported as they are read."""
    items: list[tuple[int, str, JobRequest]] = []
    size = 0
    for number, raw in enumerate(stream, start=1):
        try:
            text = raw.decode()
        except UnicodeDecodeError as exc:
            report.read(len(raw), line=True)
            report.fail(number, f"not UTF-8: {exc.reason} at byte {exc.start}", "", len(raw))
            continue
        text = (text.removeprefix("\ufeff") if number == 1 else text).strip()
        report.read(len(raw), line=bool(text))
        if not text:
            continue
        try:
            request = parser.request(number, text)
        except WheelError as exc:
            report.fail(number, str(exc), text, len(raw))
            continue
        if items and (len(items) >= max_lines or size + len(raw) > max_bytes):
            yield _batch(items, size)
            items, size = [], 0
        items.append((number, text, request))
        size += len(raw)
    if items:
        yield _batch(items, size)


def _batch(items: list[tuple[int, str, JobRequest]], size: int) -> Batch:
    numbers, texts, requests = zip(*items, strict=True)
    return Batch(numbers=numbers, texts=texts, requests=requests, size=size)


def load(
    stream: Iterable[bytes],
    report: Report,
    sender: Sender,
    *,
    parser: LineParser,
    batch: int,
    parallel: int,
) -> None:
    """Read, check and send every line, ``parallel`` calls in flight at once,
    until the end of the stream or until a batch stops the import."""
    in_flight: dict[Future[Sent], Batch] = {}

    def settle(futures: Iterable[Future[Sent]]) -> None:
        for future in futures:
            sent = future.result()
            report.settle(in_flight.pop(future), sent)

    with ThreadPoolExecutor(parallel, thread_name_prefix="wheel-import") as pool:
        try:
            for chunk in batches(stream, parser, report, max_lines=batch):
                while len(in_flight) >= parallel:
                    done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                    settle(done)
                if sender.stop.is_set():
                    break
                in_flight[pool.submit(sender.send, chunk)] = chunk
            else:
                report.complete = True
        except KeyboardInterrupt:
            report.stop(INTERRUPTED)
            sender.stop.set()
        settle(list(in_flight))


# -- the command --------------------------------------------------------------------


def _count(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not within [{low}, {high}]")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        return parse_duration(text, "duration").total_seconds()
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _input(path: str, stack: ExitStack) -> tuple[IO[bytes], str, int | None]:
    """The stream to read, its name for messages, and its size when it is a file."""
    if path == "-":
        stream: IO[bytes] = sys.stdin.buffer
        name = "<stdin>"
    else:
        try:
            stream = stack.enter_context(open(path, "rb"))  # noqa: SIM115 - closed by the stack
        except OSError as exc:
            raise WheelError(f"{path}: {exc.strerror}") from None
        name = path
    try:
        info = os.fstat(stream.fileno())
    except (OSError, ValueError):  # a stream without a file under it
        return stream, name, None
    return stream, name, info.st_size if stat.S_ISREG(info.st_mode) else None


def cmd_import(ns: argparse.Namespace) -> int:
    with ExitStack() as stack:
        stream, source, size = _input(ns.file, stack)
        errors = None
        if ns.errors:
            try:
                errors = stack.enter_context(open(ns.errors, "w", encoding="utf-8"))
            except OSError as exc:
                raise WheelError(f"{ns.errors}: {exc.strerror}") from None
        report = Report(
            source=source, total_bytes=size, err=sys.stderr, tty=sys.stderr.isatty(), errors=errors
        )
        client = stack.enter_context(
            Client(
                ns.target,
                timeout=ns.call_timeout,
                security=client_security(ns),
                token=ns.token,
                codec=codec_of(ns),
            )
        )
        report.start()
        try:
            load(
                stream,
                report,
                Sender(client, retry_backoff(ns.retry_for), on_retry=report.retrying),
                parser=LineParser(now=datetime.now(UTC)),
                batch=ns.batch,
                parallel=ns.parallel,
            )
        finally:
            summary = report.close()
    if summary.stopped is not None:
        print(
            f"wheelctl import: stopped: {summary.stopped}. Run the same import again to send"
            " the rest: a line already in is not created twice.",
            file=sys.stderr,
        )
    print(json.dumps(summary.as_json()) if ns.json else summary.text(), flush=True)
    if summary.stopped == INTERRUPTED:
        return 130
    return 0 if summary.ok else 1


IMPORT_HELP = """\
Each line is a JSON object whose keys are the job options of wheelctl submit,
with _ for -, e.g.
  {"name": "report-7", "handler": "send_report", "cron": "0 2 * * *",
   "tz": "Europe/Paris", "catch_up": "skip", "max_attempts": 3, "payload": {"id": 7}}
Values are strings, numbers for numeric options (and epoch ms for at and
start), true/false for switches; payload takes any JSON value. Blank lines are
skipped; relative times (+5s) count from the start of the import.

Idempotency: each line is sent with its own idempotency_key (or key) if it
gives one, else with the key import-N-DIGEST, N the line's number and DIGEST
the first 32 hex digits of the SHA-256 of its text (without surrounding
whitespace). So running the same file again (after a crash, say) creates
nothing twice: the lines already in are counted as "already existed". Keep
the lines at their numbers, and times absolute, in a file you may import again.

Each bad line is reported on stderr as FILE:N: reason (and with --errors as a
JSON line {"line", "error", "text"}); the others go in all the same. A call
that fails with UNAVAILABLE or DEADLINE_EXCEEDED is retried with backoff for
--retry-for; after that, or when a whole call fails otherwise, the import
stops. Exit status: 0 when every line went in, 1 otherwise (2: nothing was
read, 130: interrupted).
"""


def register(sub: Any, target: str, target_help: str) -> None:
    """Add ``wheelctl import`` to ``wheelctl``'s subcommands."""
    p = sub.add_parser(
        "import",
        help="submit the jobs of a JSON Lines file, one submit a line",
        description="Submit the jobs of a JSON Lines file (FILE, or - for stdin) in batches,"
        " with progress on stderr and a summary at the end.",
        epilog=IMPORT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", metavar="FILE", help="JSON Lines, one job a line; - reads stdin")
    p.add_argument("--target", default=target, help=target_help)
    add_token_flag(p)
    add_codec_flag(p)
    p.add_argument(
        "--batch",
        type=_count(1, MAX_BATCH),
        default=5000,
        metavar="N",
        help="lines a call, at most (and 16 MiB of them; default %(default)s)",
    )
    p.add_argument(
        "--parallel",
        type=_count(1, 64),
        default=3,
        metavar="N",
        help="calls in flight at once (default %(default)s)",
    )
    p.add_argument(
        "--call-timeout",
        type=_seconds,
        default="60s",
        metavar="DURATION",
        help="how long one call may take, tries of other nodes included (default %(default)s)",
    )
    p.add_argument(
        "--retry-for",
        type=_seconds,
        default="5m",
        metavar="DURATION",
        help="how long a call that fails with UNAVAILABLE or DEADLINE_EXCEEDED is retried"
        " before the import stops (default %(default)s)",
    )
    p.add_argument("--errors", metavar="PATH", help="also write each bad line there, as JSON")
    p.add_argument("--json", action="store_true", help="the summary as one JSON object")
    p.set_defaults(fn=cmd_import)
