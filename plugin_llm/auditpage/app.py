"""The auditor's page as a Starlette app: read-only views over the audit logs and the limits store.

Served alone by ``plugin-llm audit serve`` and under ``/audit`` by ``plugin-llm serve`` (with the
admin token only). GET only, apart from the sign-in form; every answer carries a strict
Content-Security-Policy (scripts from the app's own static files only) and ``no-store``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from audit.reader import parse_time
from audit.records import DECISIONS, STATUSES
from audit.replicas import Replica
from audit.signing import key_file, pub_file
from plugin_llm.auditpage import data, render

__all__ = ["create_audit_app", "ADMIN_TOKEN_ENV", "MIN_TOKEN_CHARS", "COOKIE"]

#: the environment variable holding the admin token (never handed to a plugin: see plugin_env.py)
ADMIN_TOKEN_ENV = "PLUGIN_LLM_ADMIN_TOKEN"
MIN_TOKEN_CHARS = 32
COOKIE = "plugin_llm_audit"
STATIC = Path(__file__).with_name("static")
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}
_MAX_FIELD = 256
_MAX_FORM_BYTES = 4096


def _session(token: str) -> str:
    """The sign-in cookie's value: derived from the token, so the cookie never holds the token itself."""
    return hmac.new(token.encode("utf-8"), b"plugin-llm audit page session", hashlib.sha256).hexdigest()


def _html(body: str, status: int = 200, headers: dict[str, str] | None = None) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers={**_HEADERS, **(headers or {})})


class _Auth:
    """The admin token, if one is required: ``Authorization: Bearer`` or the sign-in cookie."""

    def __init__(self, token: str | None, on_refused: Callable[[Request], None] | None) -> None:
        self.token, self.on_refused = token, on_refused
        self.cookie = _session(token) if token else None

    def allowed(self, request: Request) -> bool:
        if self.token is None:
            return True
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return hmac.compare_digest(value.strip()[:1024].encode("utf-8", "replace"), self.token.encode("utf-8"))
        cookie = request.cookies.get(COOKIE, "")[:128]
        return bool(cookie) and hmac.compare_digest(cookie.encode("ascii", "replace"), self.cookie.encode("ascii"))

    def refused(self, request: Request) -> None:
        if self.on_refused is not None:
            self.on_refused(request)


_LOCAL_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]", "::1"})


def _local_host(request: Request) -> bool:
    """The Host header names this machine's loopback: a page without a token answers only to those names."""
    host = request.headers.get("host", "")[:300].strip().lower()
    if host.startswith("["):
        name = host.split("]", 1)[0] + "]"
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return name in _LOCAL_NAMES or (name.startswith("127.") and name.replace(".", "").isdigit())


def _base(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


def _text(params: Any, name: str) -> str:
    value = params.get(name, "")
    return value[:_MAX_FIELD].strip() if isinstance(value, str) else ""


def _filters(request: Request, source: data.Source) -> tuple[data.Filters, dict[str, str], str | None]:
    """The listing's filters from the query string, checked; an error message instead of a 500 for bad ones."""
    params = request.query_params
    form = {k: _text(params, k) for k in ("plugin", "status", "decision", "since", "until", "replica")}
    error = None
    since = until = None
    try:
        since = parse_time(form["since"]) if form["since"] else None
        until = parse_time(form["until"]) if form["until"] else None
    except ValueError as exc:
        error = f"{exc}"
    if form["status"] and form["status"] not in STATUSES:
        error, form["status"] = f"not a status: {form['status']}", ""
    if form["decision"] and form["decision"] not in DECISIONS:
        error, form["decision"] = f"not a decision: {form['decision']}", ""
    names = [r.name for r in source.replicas]
    if form["replica"] and form["replica"] not in names:
        error, form["replica"] = f"no replica named {form['replica']}", ""
    filters = data.Filters(plugin=form["plugin"] or None, status=form["status"] or None,
                           decision=form["decision"] or None, since=since, until=until,
                           replica=form["replica"] or None)
    return filters, form, error


def create_audit_app(source: data.Source, *, token: str | None = None,
                     on_refused: Callable[[Request], None] | None = None, secure_cookie: bool = False) -> Starlette:
    """The page over ``source``; with ``token``, every view needs it (Bearer header, or the sign-in form's
    cookie). ``on_refused(request)`` is told of each refused request (the service audits them)."""
    auth = _Auth(token, on_refused)

    def guarded(view: Callable[[Request], Any]) -> Callable[[Request], Any]:
        async def handler(request: Request) -> Response:
            if token is None and not _local_host(request):  # DNS rebinding: another site's name for 127.0.0.1
                return _html(render.error_page(_base(request), "Wrong host", "open this page as 127.0.0.1 or "
                                               "localhost (or serve it with --token)"), 421)
            if not auth.allowed(request):
                auth.refused(request)
                if request.headers.get("authorization"):
                    return _html(render.error_page(_base(request), "Not allowed", "That is not the admin token."), 401)
                return RedirectResponse(_base(request) + "/login", status_code=303, headers=_HEADERS)
            return await view(request)
        return handler

    async def overview(request: Request) -> Response:
        def build() -> str:
            view = data.overview(source)
            return render.overview_page(_base(request), view, data.chart_series(view), data.chain_states(source),
                                        source.several)
        return _html(await asyncio.to_thread(build))

    async def records(request: Request) -> Response:
        filters, form, error = _filters(request, source)
        raw_page = _text(request.query_params, "page")
        page = int(raw_page) if raw_page.isdigit() and len(raw_page) < 6 else 1

        def build() -> str:
            found, more = ([], False) if error else data.records_page(source, filters, page)
            return render.records_page(_base(request), found, more, page, form,
                                       [r.name for r in source.replicas], error)
        return _html(await asyncio.to_thread(build), 400 if error else 200)

    async def record(request: Request) -> Response:
        replica = str(request.path_params["replica"])[:_MAX_FIELD]
        raw = str(request.path_params["seq"])
        if not raw.isdigit() or len(raw) > 19:
            return _html(render.error_page(_base(request), "No such record", "seq must be a whole number"), 404)

        def build() -> tuple[str, int]:
            found = data.find_record(source, replica, int(raw))
            if found is None:
                return render.error_page(_base(request), "No such record",
                                         f"replica {replica!r} has no record seq {raw}"), 404
            chosen = next(r for r in source.replicas if r.name == replica)
            return render.record_page(_base(request), found, data.chain_state(chosen)), 200
        body, status = await asyncio.to_thread(build)
        return _html(body, status)

    async def chain(request: Request) -> Response:
        states = await asyncio.to_thread(data.chain_states, source)
        return _html(render.chain_page(_base(request), states))

    async def login(request: Request) -> Response:
        base = _base(request)
        if token is None:
            return RedirectResponse(base + "/", status_code=303, headers=_HEADERS)
        if request.method == "GET":
            return _html(render.login_page(base, False))
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > _MAX_FORM_BYTES:
                return _html(render.error_page(base, "Too large", "the form is too large"), 413)
        given = (parse_qs(body.decode("utf-8", "replace")).get("token") or [""])[0].strip()
        if not hmac.compare_digest(given.encode("utf-8", "replace"), token.encode("utf-8")):
            auth.refused(request)
            return _html(render.login_page(base, True), 401)
        response = RedirectResponse(base + "/", status_code=303, headers=_HEADERS)
        response.set_cookie(COOKIE, auth.cookie or "", httponly=True, samesite="strict", secure=secure_cookie,
                            path=(base or "") + "/")
        return response

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        return _html(render.error_page(_base(request), "Not found" if status == 404 else "Not allowed",
                                       "no such page" if status == 404 else "this page is read-only"), status)

    return Starlette(
        routes=[
            Route("/", guarded(overview), methods=["GET"]),
            Route("/records", guarded(records), methods=["GET"]),
            Route("/record/{replica}/{seq}", guarded(record), methods=["GET"]),
            Route("/chain", guarded(chain), methods=["GET"]),
            Route("/login", login, methods=["GET", "POST"]),
            Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
        ],
        exception_handlers={404: not_found, 405: not_found},
    )


def service_mount(home: Path, on_refused: Callable[[Request], None] | None = None) -> Mount | None:
    """``/audit`` for ``plugin-llm serve``: the page over the home's log, behind the admin token in
    ``$PLUGIN_LLM_ADMIN_TOKEN``. None (no route: 404) when it is unset, too short, or shaped like a plugin token."""
    import logging
    import os

    token = os.environ.get(ADMIN_TOKEN_ENV, "").strip()
    if not token:
        return None
    log = logging.getLogger("plugin_llm.service")
    if len(token) < MIN_TOKEN_CHARS or token.startswith("plg_"):
        log.warning("service: /audit is off: $%s must be at least %d random characters and not a plugin token",
                    ADMIN_TOKEN_ENV, MIN_TOKEN_CHARS)
        return None
    try:
        from plugin_llm.config import get_config_source  # on first use: it loads PyYAML

        configured = get_config_source(home).current().audit.signing_key or None
    except Exception:  # noqa: BLE001 - a broken config: the default key location
        configured = None
    pub = pub_file(key_file(home, configured))
    source = data.Source((Replica(home.resolve().name or "home", home / "logs" / "agent.log",
                                  pub if pub.is_file() else None),), home)
    return Mount("/audit", app=create_audit_app(source, token=token, on_refused=on_refused))
