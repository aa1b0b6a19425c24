"""The dashboard's Starlette app: server-rendered pages, htmx fragments, a JSON history
for the charts, a server-sent-event stream that says when to refresh, and the drain
action.

Each page is ``/<name>`` (the whole page) and ``/fragment/<name>`` (its live part, what
htmx swaps in on every tick); both render the same template from `roost.dashboard.views`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from roost.bus import subjects
from roost.dashboard import fmt, views
from roost.dashboard.access import CHALLENGE, basic_user, is_loopback
from roost.dashboard.history import History
from roost.dashboard.recorder import Recorder
from roost.dashboard.sources import ClusterSource, ConsoleUnavailable, DrainFailed

log = logging.getLogger(__name__)

PAGES = {
    "overview": ("/", "Overview"),
    "nodes": ("/nodes", "Nodes"),
    "instances": ("/instances", "Instances"),
    "placement": ("/placement", "Placement"),
    "pools": ("/pools", "Pools"),
    "events": ("/events", "Events"),
}


@dataclass(frozen=True)
class DashboardSettings:
    host: str = "127.0.0.1"
    credentials: Mapping[str, str] = field(default_factory=dict)
    """Access key id -> secret; the same keys the gateway takes."""
    ec2_endpoint: str = "$AWS_ENDPOINT_URL_EC2"
    """What the AWS CLI commands shown on the pages point at."""

    @property
    def reads_need_auth(self) -> bool:
        return not is_loopback(self.host)


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("roost.dashboard", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(fmt.FILTERS)
    env.globals.update(pct=fmt.pct, pages=PAGES, query_with=query_with)
    return env


def query_with(query: Mapping[str, str], **extra: object) -> str:
    return urlencode({**query, **{k: str(v) for k, v in extra.items()}})


class _ReadAuth(BaseHTTPMiddleware):
    """Off loopback, every page asks for the credentials (health and static files
    excepted)."""

    def __init__(self, app: Any, credentials: Mapping[str, str]) -> None:
        super().__init__(app)
        self.credentials = credentials

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint
                       ) -> Response:
        path = request.url.path
        if path == "/healthz" or path.startswith("/static/"):
            return await call_next(request)
        if basic_user(request.headers.get("authorization", ""), self.credentials) is None:
            return Response("credentials needed\n", 401, headers=CHALLENGE,
                            media_type="text/plain")
        return await call_next(request)


def build_app(source: ClusterSource, recorder: Recorder, settings: DashboardSettings,
              *, heartbeat: float = 15.0) -> Starlette:
    env = environment()
    history: History = recorder.history

    def render(template: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        html = env.get_template(template).render(**ctx)
        return HTMLResponse(html, status)

    def context(name: str, request: Request) -> dict[str, Any]:
        state = source.state()
        q = request.query_params
        body: dict[str, Any]
        if name == "overview":
            body = views.overview(state, history)
        elif name == "nodes":
            body = views.nodes(state, q)
        elif name == "instances":
            body = views.instances(state, q, endpoint=settings.ec2_endpoint)
        elif name == "placement":
            body = views.placement(state)
        elif name == "pools":
            body = views.pools(state)
        else:
            body = views.events(history, q)
        can_write = bool(settings.credentials)
        query = request.url.query
        return {"page": name, "v": body, "at": state.at, "can_write": can_write,
                "live_url": f"/fragment/{name}" + (f"?{query}" if query else "")}

    def page(name: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return render(f"{name}.html", **context(name, request), full=True)
        return endpoint

    async def fragment(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in PAGES:
            return render("missing.html", 404, what=f"no page {name!r}", full=False,
                          page="", at=None, live_url="")
        return render(f"{name}.html", **context(name, request), full=False)

    async def instance(request: Request) -> Response:
        iid = request.path_params["instance_id"]
        state = source.state()
        v = views.instance(state, history, iid, endpoint=settings.ec2_endpoint)
        full = request.headers.get("hx-request") != "true"
        if v is None:
            return render("missing.html", 404, what=f"no instance {iid}", full=full,
                          page="instances", at=state.at, live_url="")
        return render("instance.html", v=v, page="instances", at=state.at, full=full,
                      live_url=f"/instances/{iid}")

    async def history_json(request: Request) -> Response:
        return JSONResponse(views.chart_series(history))

    async def stream(request: Request) -> Response:
        async def events() -> AsyncIterator[str]:
            seq = recorder.seq
            yield f"retry: 2000\nevent: hello\ndata: {json.dumps({'seq': seq})}\n\n"
            while not recorder.stopped:
                now = await recorder.wait_tick(seq, heartbeat)
                if recorder.stopped:
                    return
                if now == seq:
                    yield ": keep-alive\n\n"
                    continue
                seq = now
                at = history.samples[-1].at if history.samples else 0.0
                yield f"event: tick\ndata: {json.dumps({'seq': seq, 'at': at})}\n\n"
        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store",
                                          "X-Accel-Buffering": "no"})

    async def drain(request: Request) -> Response:
        node_id = request.path_params["node_id"]
        user = basic_user(request.headers.get("authorization", ""), settings.credentials)
        if not settings.credentials:
            return render("notice.html", 403, ok=False, text="This dashboard is read-only: "
                          "it was started without credentials.")
        if user is None:
            return Response("credentials needed to drain\n", 401, headers=CHALLENGE,
                            media_type="text/plain")
        if request.headers.get("hx-request") != "true":
            return render("notice.html", 403, ok=False,
                          text="Drain only from the dashboard's own page.")
        try:
            subjects.check_node_id(node_id)
            reply = await source.drain(node_id)
        except (DrainFailed, ValueError) as exc:
            return render("notice.html", 502, ok=False, text=str(exc))
        log.warning("node %s drained from the dashboard by %s", node_id, user)
        return render("notice.html", ok=True,
                      text=f"Node {reply.node_id} is draining: it takes no new launches; "
                           f"its {reply.instances} instances keep running.")

    async def console(request: Request) -> Response:
        """The console tail needs the credentials, as GetConsoleOutput does: a program's
        output may hold what its owner would not show every reader of the dashboard."""
        if not settings.credentials:
            return render("notice.html", 403, ok=False, text="This dashboard is read-only "
                          "(started without credentials), so it shows no console output.")
        if basic_user(request.headers.get("authorization", ""), settings.credentials) is None:
            return Response("credentials needed for console output\n", 401,
                            headers=CHALLENGE, media_type="text/plain")
        rec = source.state().instances.get(request.path_params["instance_id"])
        if rec is None:
            return render("notice.html", 404, ok=False, text="No such instance.")
        try:
            text, at = await source.console(rec)
        except ConsoleUnavailable as exc:
            return render("notice.html", 502, ok=False, text=str(exc))
        return render("console.html", text=text, at=at, rec=rec)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "ticks": recorder.seq})

    routes: list[BaseRoute] = [Route(path, page(name)) for name, (path, _) in PAGES.items()]
    routes += [
        Route("/fragment/{name}", fragment),
        Route("/instances/{instance_id}", instance),
        Route("/instances/{instance_id}/console", console),
        Route("/nodes/{node_id}/drain", drain, methods=["POST"]),
        Route("/api/history", history_json),
        Route("/stream", stream),
        Route("/healthz", healthz),
        Mount("/static", StaticFiles(packages=[("roost.dashboard", "static")]), name="static"),
    ]
    middleware = ([Middleware(_ReadAuth, credentials=settings.credentials)]
                  if settings.reads_need_auth else [])
    return Starlette(routes=routes, middleware=middleware)
