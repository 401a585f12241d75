"""The web console's HTTP side: one static page and the JSON API under
``/api/``, served by aiohttp on the node's event loop.

Every JSON call is one or two calls of the node's gRPC API through
``wheel.client.AsyncClient``, made with the browser's bearer token: the API
decides who may see and do what (scopes, tenants: another tenant's job is
NOT_FOUND), never the console. The console adds one rule of its own: it
acts (pause, resume, trigger, redrive) only when started with actions on;
read-only, an action answers 403 and says so.

Lists are pages with cursors, as the API's are: a page of jobs is one
``ListJobs`` of one page, read through an index (by id, by name prefix, by
state), whatever the number of jobs in the store.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any

from aiohttp import web

from wheel.client import AsyncClient, JobState, RunState
from wheel.console._json import audit_row, job_detail, job_row, jsonable, run_row
from wheel.console._overview import alerts_json, feed_row, history_json, overview_json
from wheel.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    WheelError,
)
from wheel.tls import ChannelSecurity, LiveChannelSecurity

log = logging.getLogger("wheel.console")

# Clients kept, one a token (the channel is what costs: a handshake).
CLIENTS_KEPT = 32
# A client put aside is closed this long after: its calls time out before.
RETIRED_CLOSE_S = 30.0
# The page sizes a list may ask for.
MAX_PAGE = 500
DEFAULT_PAGE = 50
# Next fires a job's page shows, and at most.
NEXT_FIRES = 10
MAX_NEXT_FIRES = 100
MS = timedelta(milliseconds=1)
# The overview's windows: how far back, and the width of a bar.
WINDOWS = {
    "hour": (timedelta(hours=1), timedelta(minutes=1)),
    "day": (timedelta(days=1), timedelta(minutes=15)),
}
# Alerts the overview reads back (the last hour's, the newest of them).
ALERTS_SHOWN = 100
# The pause, resume, trigger and cancel actions, by path word.
JOB_ACTIONS = ("pause", "resume", "trigger", "cancel")

STATIC = resources.files("wheel.console") / "static"
# The page loads nothing from elsewhere, runs no inline script, and is
# framed by nobody.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self';"
        " connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ConsoleError(Exception):
    """An answer other than 200, with the message the page shows."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def http_status(exc: WheelError) -> int:
    """The HTTP status of an API failure (the gRPC code's counterpart)."""
    for kind, status in (
        (Unauthenticated, 401),
        (PermissionDenied, 403),
        (NotFound, 404),
        (InvalidArgument, 400),
        (AlreadyExists, 409),
        (FailedPrecondition, 409),
        (ResourceExhausted, 429),
    ):
        if isinstance(exc, kind):
            return status
    return 502  # the node did not answer, or failed: a bad gateway to it


class Console:
    """The console's app over the node's API at ``target``.

    ``auth``: the node checks tokens, so a call without one is refused here
    at once (401), and the page asks for one. ``actions``: whether the
    console may change anything. ``security``: how the console's channel to
    the node is secured (the node's own channels to its peers: a reload that
    replaces it makes new channels). ``lag_objective_ms``: the node's
    dispatch lag objective, drawn on the lag charts.
    """

    def __init__(
        self,
        target: str,
        *,
        auth: bool,
        actions: bool,
        security: ChannelSecurity | LiveChannelSecurity | None = None,
        node_id: str = "",
        lag_objective_ms: int = 0,
    ) -> None:
        self.target = target
        self.lag_objective_ms = lag_objective_ms
        self.auth = auth
        self.actions = actions
        self.node_id = node_id
        self._security = (
            security if isinstance(security, LiveChannelSecurity) else LiveChannelSecurity(security)
        )
        self._version = self._security.version
        self._clients: OrderedDict[str, AsyncClient] = OrderedDict()
        # Clients put aside (evicted, or of TLS files replaced since), closed
        # once the calls on them have had their time.
        self._retired: set[AsyncClient] = set()
        self._closing: set[asyncio.Task[None]] = set()

    # -- the app ----------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors], client_max_size=64 * 1024)
        get, post = web.get, web.post
        app.add_routes(
            [
                get("/", self._index),
                get("/static/{name}", self._static),
                get("/api/config", self._config),
                get("/api/jobs", self._jobs),
                get("/api/jobs/{job_id}", self._job),
                get("/api/jobs/{job_id}/runs", self._runs),
                get("/api/jobs/{job_id}/dead-letters", self._job_dead_letters),
                post("/api/jobs/{job_id}/dead-letters/redrive", self._redrive),
                post("/api/jobs/{job_id}/{action}", self._job_action),
                get("/api/dead-letters", self._dead_letters),
                get("/api/in-flight", self._in_flight),
                get("/api/workers", self._workers),
                get("/api/limits", self._limits),
                get("/api/cluster", self._cluster),
                get("/api/lag", self._lag),
                get("/api/audit", self._audit),
                get("/api/overview", self._overview),
                get("/api/runs", self._recent_runs),
                get("/api/jobs/{job_id}/history", self._history),
                get("/api/alerts", self._alerts),
            ]
        )
        app.on_cleanup.append(self._close)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except ConsoleError as exc:
            response = _error(exc.status, str(exc))
        except WheelError as exc:
            response = _error(http_status(exc), str(exc))
        except web.HTTPException as exc:
            if not request.path.startswith("/api/"):
                raise
            response = _error(exc.status, exc.reason)
        except Exception:
            log.exception("the console failed to answer %s %s", request.method, request.path)
            response = _error(500, "the console failed to answer: see the node's log")
        response.headers.update(SECURITY_HEADERS)
        return response

    async def _close(self, _app: web.Application) -> None:
        for task in self._closing:
            task.cancel()
        await asyncio.gather(*self._closing, return_exceptions=True)
        for client in [*self._clients.values(), *self._retired]:
            await client.close()
        self._clients.clear()
        self._retired.clear()

    def _retire(self, client: AsyncClient) -> None:
        self._retired.add(client)
        task = asyncio.get_running_loop().create_task(self._close_later(client))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close_later(self, client: AsyncClient) -> None:
        await asyncio.sleep(RETIRED_CLOSE_S)
        self._retired.discard(client)
        await client.close()

    # -- the client of a request --------------------------------------------------------

    def client(self, request: web.Request) -> AsyncClient:
        """The API client for the request's bearer token (none without auth)."""
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else ""
        if self.auth and not token:
            raise ConsoleError(401, "this node checks tokens: sign in with a bearer token")
        if self._security.version != self._version:
            # New TLS files: new channels; calls on the old ones finish.
            for old in self._clients.values():
                self._retire(old)
            self._clients.clear()
            self._version = self._security.version
        key = hashlib.sha256(token.encode()).hexdigest()
        client = self._clients.get(key)
        if client is None:
            # "" and not None: never the node process's own $WHEEL_TOKEN.
            client = AsyncClient(self.target, security=self._security.current, token=token)
            self._clients[key] = client
            while len(self._clients) > CLIENTS_KEPT:
                self._retire(self._clients.popitem(last=False)[1])
        else:
            self._clients.move_to_end(key)
        return client

    def _may_act(self, request: web.Request) -> None:
        if not self.actions:
            raise ConsoleError(
                403,
                "this console is read-only: actions are off (start the node with"
                " wheelctl serve --console-actions to allow them)",
            )
        # A cross-site form cannot send JSON without the browser asking first,
        # and nobody answers that question: no action from another site.
        if request.content_type != "application/json":
            raise ConsoleError(415, "an action is a POST of application/json")

    # -- the page -------------------------------------------------------------------------

    async def _index(self, request: web.Request) -> web.StreamResponse:
        return _asset("index.html")

    async def _static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in ASSETS:
            raise web.HTTPNotFound()
        return _asset(name)

    async def _config(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {
                "auth": self.auth,
                "actions": self.actions,
                "node_id": self.node_id,
                # The dispatch lag objective the node checks (0: unknown).
                "lag_objective_ms": self.lag_objective_ms,
            }
        )

    # -- jobs -------------------------------------------------------------------------------

    async def _jobs(self, request: web.Request) -> web.StreamResponse:
        q = request.query
        state = q.get("state") or None
        if state is not None and state not in {s.value for s in JobState}:
            raise InvalidArgument("state", f"{state!r} is none of {[s.value for s in JobState]}")
        page = await self.client(request).jobs_page(
            tenant=q.get("tenant") or None,
            state=state,
            name_prefix=q.get("name", ""),
            page_size=_int(q, "page_size", DEFAULT_PAGE, 1, MAX_PAGE),
            page_token=q.get("page_token", ""),
        )
        return web.json_response(
            {"jobs": [job_row(j) for j in page.items], "next_page_token": page.next_page_token}
        )

    async def _job(self, request: web.Request) -> web.StreamResponse:
        count = _int(request.query, "next_fires", NEXT_FIRES, 1, MAX_NEXT_FIRES)
        job = await self.client(request).get(_job_id(request), next_fires=count, recent_runs=1)
        return web.json_response(job_detail(job))

    async def _runs(self, request: web.Request) -> web.StreamResponse:
        q = request.query
        states = [s for s in q.get("states", "").split(",") if s]
        for s in states:
            if s not in {r.value for r in RunState}:
                raise InvalidArgument("states", f"{s!r} is none of {[r.value for r in RunState]}")
        page = await self.client(request).runs_page(
            _job_id(request),
            states=states,
            page_size=_int(q, "page_size", DEFAULT_PAGE, 1, MAX_PAGE),
            page_token=q.get("page_token", ""),
        )
        return web.json_response(
            {"runs": [run_row(r) for r in page.items], "next_page_token": page.next_page_token}
        )

    async def _job_action(self, request: web.Request) -> web.StreamResponse:
        action = request.match_info["action"]
        if action not in JOB_ACTIONS:
            raise web.HTTPNotFound()
        self._may_act(request)
        client = self.client(request)
        job_id = _job_id(request)
        if action == "trigger":
            return web.json_response({"trigger": jsonable(await client.trigger(job_id))})
        job = await getattr(client, action)(job_id)
        return web.json_response(job_detail(job))

    # -- at a glance ------------------------------------------------------------------------

    async def _overview(self, request: web.Request) -> web.StreamResponse:
        """Jobs by state and runs by bar and outcome over the last hour (a
        bar a minute) or day (a bar each 15 minutes), of every job the
        token sees (a tenant's token: its own tenant's)."""
        q = request.query
        name = q.get("window") or "hour"
        if name not in WINDOWS:
            raise InvalidArgument("window", f"{name!r} is none of {sorted(WINDOWS)}")
        window, bucket = WINDOWS[name]
        got = await self.client(request).run_overview(
            tenant=q.get("tenant", ""), window=window, bucket=bucket
        )
        return web.json_response(overview_json(got, name))

    async def _recent_runs(self, request: web.Request) -> web.StreamResponse:
        """A page of the runs of every job the token sees, newest first."""
        q = request.query
        outcome = q.get("outcome") or None
        if outcome is not None and outcome not in {r.value for r in RunState}:
            raise InvalidArgument(
                "outcome", f"{outcome!r} is none of {[r.value for r in RunState]}"
            )
        page = await self.client(request).recent_runs_page(
            tenant=q.get("tenant", ""),
            outcome=outcome,
            handler=q.get("handler", ""),
            job_name=q.get("job", ""),
            page_size=_int(q, "page_size", DEFAULT_PAGE, 1, MAX_PAGE),
            page_token=q.get("page_token", ""),
        )
        return web.json_response(
            {"runs": [feed_row(r) for r in page.items], "next_page_token": page.next_page_token}
        )

    async def _history(self, request: web.Request) -> web.StreamResponse:
        """A job's last fires and its last day's success rate and durations."""
        fires = _int(request.query, "fires", 100, 1, 1000)
        got = await self.client(request).job_history(_job_id(request), fires=fires)
        return web.json_response(history_json(got))

    async def _alerts(self, request: web.Request) -> web.StreamResponse:
        """The node's alerts of the last hour, newest first, and those firing
        now with when each last was raised (an operator's token)."""
        since = datetime.now(UTC) - timedelta(hours=1)
        got = await self.client(request).alerts(since=since, limit=ALERTS_SHOWN)
        return web.json_response(alerts_json(got))

    # -- dead letters -----------------------------------------------------------------------

    async def _job_dead_letters(self, request: web.Request) -> web.StreamResponse:
        return await self._dead_page(request, _job_id(request))

    async def _audit(self, request: web.Request) -> web.StreamResponse:
        """A page of the audit trail, newest first (an operator's token)."""
        q = request.query
        size = _int(q, "page_size", DEFAULT_PAGE, 1, MAX_PAGE)
        before = _int(q, "page_token", 0, 0, 2**62)
        entries = await self.client(request).audit(before_id=before or None, limit=size)
        return web.json_response(
            {
                "entries": [audit_row(e) for e in entries],
                "next_page_token": str(entries[-1].entry_id) if len(entries) == size else "",
            }
        )

    async def _dead_letters(self, request: web.Request) -> web.StreamResponse:
        return await self._dead_page(request, None)

    async def _dead_page(self, request: web.Request, job_id: int | None) -> web.StreamResponse:
        """A page of dead letters not redriven yet, of one job or of every job
        the token sees, newest first; ``redrive`` tells the page to offer it."""
        q = request.query
        page = await self.client(request).dead_letters_page(
            job_id,
            page_size=_int(q, "page_size", DEFAULT_PAGE, 1, MAX_PAGE),
            page_token=q.get("page_token", ""),
        )
        return web.json_response(
            {
                "runs": [run_row(r) for r in page.items],
                "next_page_token": page.next_page_token,
                "redrive": self.actions,
            }
        )

    async def _redrive(self, request: web.Request) -> web.StreamResponse:
        """Run a job's dead letters again (or the one ``run_id`` names), each
        as a new attempt with a new fence."""
        self._may_act(request)
        client = self.client(request)
        body = await _json_body(request)
        run_id = body.get("run_id")
        if run_id is not None and not (
            isinstance(run_id, str | int) and not isinstance(run_id, bool) and str(run_id).isdigit()
        ):
            raise InvalidArgument("run_id", f"{run_id!r} is not a run id")
        runs = await client.redrive(
            _job_id(request), run_id=int(run_id) if run_id is not None else None
        )
        return web.json_response({"runs": [run_row(r) for r in runs]})

    # -- the node and the cluster -------------------------------------------------------------

    async def _in_flight(self, request: web.Request) -> web.StreamResponse:
        limit = _int(request.query, "limit", 100, 1, 1000)
        held = await self.client(request).in_flight(limit=limit)
        runs = [
            {**jsonable(r), "run_id": str(r.run_id), "job_id": str(r.job_id), "fence": str(r.fence)}
            for r in held.runs
        ]
        return web.json_response(
            {"runs": runs, "total": held.total, "unreachable": held.unreachable}
        )

    async def _workers(self, request: web.Request) -> web.StreamResponse:
        status = await self.client(request).status()
        return web.json_response(
            {
                "node_id": status.node_id,
                "workers": jsonable(status.worker_list),
                "unserved": jsonable(status.unserved),
            }
        )

    async def _limits(self, request: web.Request) -> web.StreamResponse:
        """The concurrency keys the token sees: their limits, runs in flight
        and fires waiting for a permit, across the cluster."""
        limits = await self.client(request).limits()
        return web.json_response(
            {
                "limits": [
                    {
                        "tenant": x.tenant,
                        "key": x.key,
                        "max_concurrent": x.max_concurrent or 0,
                        "rate": x.rate or 0,
                        "rate_period_ms": int(x.per.total_seconds() * 1000) if x.rate else 0,
                        "burst": x.burst or 0,
                        "in_flight": x.in_flight,
                        "waiting": x.waiting,
                    }
                    for x in limits
                ]
            }
        )

    async def _cluster(self, request: web.Request) -> web.StreamResponse:
        client = self.client(request)
        status = await client.status(include_shards=True)
        membership = await client.membership()
        out = jsonable(status)
        out.pop("worker_list", None)
        out.pop("unserved", None)
        out["members"] = jsonable(membership.members)
        out["shard_owners"] = membership.shard_owners
        out["membership_version"] = membership.version
        return web.json_response(out)

    async def _lag(self, request: web.Request) -> web.StreamResponse:
        minutes = await self.client(request).lag_history()
        return web.json_response(
            {
                "minutes": [
                    {
                        "minute": jsonable(m.minute),
                        "count": m.count,
                        "p50_ms": m.p50 / MS,
                        "p99_ms": m.p99 / MS,
                        "max_ms": m.max / MS,
                    }
                    for m in minutes
                ]
            }
        )


# -- helpers ----------------------------------------------------------------------------------

ASSETS = {
    "index.html": "text/html",
    "console.js": "text/javascript",
    "glance.js": "text/javascript",
    "console.css": "text/css",
    # uPlot 1.6.32 (MIT), from the npm registry's tarball, unchanged: its
    # dist/uPlot.iife.min.js and dist/uPlot.min.css, and its LICENSE.
    "uPlot.iife.min.js": "text/javascript",
    "uPlot.min.css": "text/css",
    "uPlot.LICENSE.txt": "text/plain",
}


def _asset(name: str) -> web.Response:
    body = (STATIC / name).read_bytes()
    return web.Response(body=body, content_type=ASSETS[name], charset="utf-8")


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message, "status": status}, status=status)


def _int(query: Any, name: str, default: int, low: int, high: int) -> int:
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(name, f"{raw!r} is not a whole number") from None
    if not low <= value <= high:
        raise InvalidArgument(name, f"{value} is not between {low} and {high}")
    return value


def _job_id(request: web.Request) -> int:
    raw = request.match_info["job_id"]
    if not raw.isdigit() or int(raw) <= 0 or int(raw) >= 2**63:
        raise InvalidArgument("job_id", f"{raw!r} is not a job id")
    return int(raw)


async def _json_body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InvalidArgument("body", "is not JSON") from None
    if not isinstance(body, dict):
        raise InvalidArgument("body", "is not a JSON object")
    return body
