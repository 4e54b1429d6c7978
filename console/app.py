"""The dashboard's web application (Starlette): its routes, how each answers bad input,
and the refresh of its live parts.

    GET  /                          overview: processes, positions, rates, disk, role
    GET  /topics, /topics/T         topics and their queues, a rate sparkline each
    GET  /groups, /groups/G/T       consumer groups: per queue committed, max, lag;
                                    members; a reset form
    POST /groups/G/T/reset          target=...: shows the new offsets and asks to
                                    confirm; with confirmed=yes commits them (a write)
    GET  /messages?topic=&key=      RocketMQ's three queries: by key, by msgId
         /messages?msg_id=          (the message's page), by topic and time range
         /messages?topic=&begin=&end=
    GET  /messages/ID, /messages/ID/body   a message's page; its whole body
    POST /send                      topic, body, tags, keys: a test message (a write)
    GET  /api/...                   the same data as JSON (overview, topics, groups,
                                    messages)

An HTML page's live part (``<div id="live" data-refresh=MS>``) is fetched again by
``static/dashboard.js`` with the header ``X-Fragment: live`` and replaced in place: the
page never reloads. Bad input is answered 4xx with a sentence, as JSON under ``/api/``
(``{"error", "status"}``) and as a page elsewhere; an unexpected fault is logged with
its stack and answered 500 without it.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from rocketstore.client.group_offsets import GroupActiveError
from rocketstore.client.topics import NotInStoreError
from rocketstore.console import charts, views
from rocketstore.console.history import SAMPLE_INTERVAL_S, History
from rocketstore.console.safety import (
    Authority, BodyTooLarge, Guard, log_write, same_origin)
from rocketstore.procs.status import size_text
from rocketstore.shm.positions import PositionTableError
from rocketstore.storage import StoreConfig

log = logging.getLogger(__name__)

HERE = os.path.dirname(os.path.abspath(__file__))
REFRESH_MS = 3000
LIVE_PARTS = ("_overview.html", "_topics.html", "_topic.html", "_groups.html", "_group.html")
FORM_SLACK_BYTES = 64 * 1024       # a test send's form: the body, and the other fields


def create_app(config: StoreConfig, *, history_interval_s: float = SAMPLE_INTERVAL_S):
    """The dashboard of the store at ``config.store_path_root_dir``, wrapped in its
    ``Guard``. Raises ``AuthFileError`` for a ``dashboard_auth`` it cannot use."""
    store_dir = config.store_path_root_dir
    history = History(store_dir, history_interval_s)
    authority = Authority.from_file(config.dashboard_auth) if config.dashboard_auth else None

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        history.start()
        try:
            yield
        finally:
            history.stop()

    app = Starlette(routes=_routes(), lifespan=lifespan, exception_handlers={
        Exception: _fault, HTTPException: _http_error, views.BadRequest: _bad_request,
        NotInStoreError: _not_found, views.MessageNotFound: _not_found,
        PositionTableError: _not_running, GroupActiveError: _conflict,
        BodyTooLarge: _too_large})
    app.state.config, app.state.store_dir, app.state.history = config, store_dir, history
    app.state.templates = _templates()
    max_body = config.max_message_size + FORM_SLACK_BYTES
    return Guard(app, max_body, authority)


def _templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=os.path.join(HERE, "templates"))
    env = templates.env
    env.filters["size"] = size_text
    env.filters["when"] = _when
    env.filters["age"] = _age
    env.globals.update(charts=charts, refresh_ms=REFRESH_MS)
    return templates


def _when(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _age(ms: int | None) -> str:
    if ms is None:
        return "-"
    return f"{ms} ms" if ms < 10_000 else f"{ms / 1000:.0f} s"


# ------------------------------------------------------------------------------ pages
def _page(request: Request, template: str, **context) -> Response:
    """``template`` as a page; a page with a live part (``_NAME.html`` beside it) only
    that part when the refresh asks for it."""
    state = request.app.state
    live_template = "_" + template
    if live_template in LIVE_PARTS and request.headers.get("x-fragment") == "live":
        template = live_template
    context.update(request=request, live_template=live_template,
                   writes=state.config.dashboard_allow_writes)
    return state.templates.TemplateResponse(request, template, context)


def _wants_json(request: Request) -> bool:
    return request.url.path.startswith("/api/") or \
        "application/json" in request.headers.get("accept", "")


async def overview(request: Request) -> Response:
    state = request.app.state
    st = await run_in_threadpool(views.overview, state.store_dir, state.config)
    series = state.history.series()
    if _wants_json(request):
        return JSONResponse({**st, "series": series})
    return _page(request, "overview.html", st=st, series=series)


async def topics(request: Request) -> Response:
    state = request.app.state
    rows = await run_in_threadpool(views.topics, state.store_dir)
    if _wants_json(request):
        return JSONResponse({"topics": rows})
    return _page(request, "topics.html", topics=rows, rates=state.history.topic_rates())


async def topic(request: Request) -> Response:
    state = request.app.state
    row = await run_in_threadpool(views.topic, state.store_dir, request.path_params["topic"])
    if _wants_json(request):
        return JSONResponse(row)
    return _page(request, "topic.html", t=row,
                 rate=state.history.topic_rates().get(row["topic"], []))


async def groups(request: Request) -> Response:
    rows = await run_in_threadpool(views.groups, request.app.state.store_dir)
    if _wants_json(request):
        return JSONResponse({"groups": rows})
    return _page(request, "groups.html", groups=rows)


async def group(request: Request) -> Response:
    p = request.path_params
    g = await run_in_threadpool(views.group, request.app.state.store_dir, p["group"],
                                p["topic"])
    if _wants_json(request):
        return JSONResponse(g)
    return _page(request, "group.html", g=g)


async def reset_group(request: Request) -> Response:
    """A reset in two steps: without ``confirmed=yes`` the page shows each queue's new
    offset and asks; with it the offsets are committed and the write logged."""
    _check_write(request)
    form = await request.form()
    p, store_dir = request.path_params, request.app.state.store_dir
    target = str(form.get("target") or "").strip()
    if target == "time":
        target = str(form.get("time") or "").strip()
        if not target:
            raise views.BadRequest("a reset to a time needs the time")
        target = f"@{views.parse_time(target, 'the reset time')}"
    if not target:
        raise views.BadRequest("a reset needs a target: earliest, latest or a time")
    if form.get("confirmed") != "yes":
        g = await run_in_threadpool(views.group, store_dir, p["group"], p["topic"], target)
        if _wants_json(request):
            return JSONResponse({**g, "confirmed": False})
        return _page(request, "reset.html", g=g)
    g = await run_in_threadpool(views.reset_group, store_dir, p["group"], p["topic"], target)
    log_write(_who(request), "reset", group=p["group"], topic=p["topic"], target=target,
              offsets={r["queue"]: r["new"] for r in g["queues"]})
    if _wants_json(request):
        return JSONResponse({**g, "confirmed": True})
    return RedirectResponse(request.url_for("group", group=p["group"], topic=p["topic"])
                            .include_query_params(reset=target), status_code=303)


async def messages(request: Request) -> Response:
    """The three queries; none asked: the search form alone."""
    q = request.query_params
    store_dir = request.app.state.store_dir
    topic_name, key, msg_id = q.get("topic", "").strip(), q.get("key", "").strip(), \
        q.get("msg_id", "").strip()
    begin, end = q.get("begin", "").strip(), q.get("end", "").strip()
    found, how = None, ""
    if msg_id:
        if _wants_json(request):
            return JSONResponse(await run_in_threadpool(views.find_by_msg_id, store_dir,
                                                        msg_id))
        await run_in_threadpool(views.find_by_msg_id, store_dir, msg_id)   # 400, 404 here
        return RedirectResponse(request.url_for("message", msg_id=msg_id), status_code=303)
    if key:
        if not topic_name:
            raise views.BadRequest("a key query needs its topic")
        found = await run_in_threadpool(views.find_by_key, store_dir, topic_name, key)
        how = f"key {key!r} in {topic_name}"
    elif begin or end:
        if not topic_name:
            raise views.BadRequest("a time range query needs its topic")
        begin_ms = views.parse_time(begin, "begin") if begin else 0
        end_ms = views.parse_time(end, "end") if end else 2 ** 62
        found = await run_in_threadpool(views.find_by_time, store_dir, topic_name,
                                        begin_ms, end_ms)
        how = f"{topic_name} stored from {begin or 'the first'} to {end or 'the last'}"
    elif topic_name:
        raise views.BadRequest("with a topic, give a key or a time range")
    if _wants_json(request):
        return JSONResponse({"messages": found or [], "query": how})
    return _page(request, "messages.html", found=found, how=how, q=q)


async def message(request: Request) -> Response:
    d = await run_in_threadpool(views.find_by_msg_id, request.app.state.store_dir,
                                request.path_params["msg_id"])
    if _wants_json(request):
        return JSONResponse(d)
    return _page(request, "message.html", m=d)


async def message_body(request: Request) -> Response:
    msg_id = request.path_params["msg_id"]
    body = await run_in_threadpool(views.message_body, request.app.state.store_dir, msg_id)
    return Response(body, media_type="application/octet-stream", headers={
        "content-disposition": f'attachment; filename="{msg_id}.bin"'})


async def send(request: Request) -> Response:
    _check_write(request)
    form = await request.form()
    fields = {k: str(form.get(k) or "") for k in ("topic", "body", "tags", "keys")}
    if not fields["topic"]:
        raise views.BadRequest("a test message needs a topic")
    r = await run_in_threadpool(views.send_test_message, request.app.state.store_dir,
                                fields["topic"], fields["body"], fields["tags"],
                                fields["keys"])
    log_write(_who(request), "send", topic=fields["topic"], tags=fields["tags"],
              keys=fields["keys"], body_bytes=len(fields["body"].encode()),
              status=r["status"], msg_id=r["msg_id"])
    if _wants_json(request):
        return JSONResponse(r, status_code=200 if r["ok"] else 502)
    return _page(request, "sent.html", r=r, topic=fields["topic"])


def _who(request: Request) -> str:
    return request.scope.get("state", {}).get("who", "anonymous")


def _check_write(request: Request) -> None:
    """A write needs ``dashboard_allow_writes`` and, from a browser, this dashboard's
    own origin."""
    if not request.app.state.config.dashboard_allow_writes:
        raise HTTPException(403, "this dashboard is read-only: set dashboard_allow_writes = "
                                 "true in [store] to reset offsets and send test messages")
    if not same_origin(request.headers.get("origin"), request.headers.get("host")):
        raise HTTPException(403, f"a write from another site "
                                 f"({request.headers.get('origin')}) is refused")


def _routes() -> list:
    return [
        Route("/", overview, name="overview"),
        Route("/api/overview", overview),
        Route("/topics", topics, name="topics"),
        Route("/api/topics", topics),
        Route("/topics/{topic}", topic, name="topic"),
        Route("/api/topics/{topic}", topic),
        Route("/groups", groups, name="groups"),
        Route("/api/groups", groups),
        Route("/groups/{group}/{topic}", group, name="group"),
        Route("/api/groups/{group}/{topic}", group),
        Route("/groups/{group}/{topic}/reset", reset_group, methods=["POST"], name="reset"),
        Route("/api/groups/{group}/{topic}/reset", reset_group, methods=["POST"]),
        Route("/messages", messages, name="messages"),
        Route("/api/messages", messages),
        Route("/messages/{msg_id}", message, name="message"),
        Route("/api/messages/{msg_id}", message),
        Route("/messages/{msg_id}/body", message_body, name="body"),
        Route("/send", send, methods=["POST"], name="send"),
        Route("/api/send", send, methods=["POST"]),
        Mount("/static", StaticFiles(directory=os.path.join(HERE, "static")), name="static"),
    ]


# ------------------------------------------------------------------------------ errors
def _error(request: Request, status: int, message: str) -> Response:
    if _wants_json(request):
        return JSONResponse({"error": message, "status": status}, status_code=status)
    templates = request.app.state.templates
    return templates.TemplateResponse(request, "error.html", {
        "request": request, "status": status, "message": message, "writes": False},
        status_code=status)


async def _http_error(request: Request, e: HTTPException) -> Response:
    return _error(request, e.status_code, str(e.detail))


async def _bad_request(request: Request, e: Exception) -> Response:
    return _error(request, 400, str(e))


async def _not_found(request: Request, e: Exception) -> Response:
    return _error(request, 404, str(e.args[0]) if e.args else str(e))


async def _not_running(request: Request, e: Exception) -> Response:
    return _error(request, 503, f"the store is not running: {e}")


async def _conflict(request: Request, e: Exception) -> Response:
    return _error(request, 409, str(e))


async def _too_large(request: Request, e: Exception) -> Response:
    return _error(request, 413, str(e))


async def _fault(request: Request, e: Exception) -> Response:
    log.exception("dashboard: %s %s failed", request.method, request.url.path)
    return _error(request, 500, f"the dashboard failed on this request ({type(e).__name__}); "
                                "its log holds the details")
