"""The dashboard's requests: who is signed in, which page, the same operations the socket serves.

A page is read through the socket's own handlers (``ops``, the table
``broker/wiring.py`` builds) with the signed-in user's ``Caller``, so a
browser sees exactly what that user's CLI sees: their own jobs (an admin:
everyone's), the groups they belong to, the nodes. Nothing here writes but
signing in and out (a session row, the sign-in note on the token row).
Every query key is checked: an unknown one, or a filter a user may not
use, is refused with what to do.
"""

from __future__ import annotations

import hmac
import logging
import os
import pwd
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from broker.caller import Caller, Handler
from broker.errors import BrokerError, ConfigError, NotFound, PermissionDenied
from broker.http_fields import ascii_digits
from broker.opsconfig import PROXY_SECRET_HOWTO
from broker.state import Services
from broker.states import JobState
from broker.web import auth, pages
from broker.web.nodes import node_time

log = logging.getLogger(__name__)

HTML = "text/html; charset=utf-8"
MAX_FORM = 4096
MAX_LIST = 1000
"""Jobs one page shows at most (the newest that match its filters; each summary costs about 1 ms)."""
JOB_FILTERS = ("user", "group", "state", "pool")
PROXY_SECRET_HEADER = "X-Gbroker-Proxy-Secret"
"""Sent by the reverse proxy with the user's name; a request naming a user without it is refused."""
MIN_SECRET = 16
PAGES = ("/", "/login", "/logout", "/jobs", "/spend", "/nodes", "/admin/tokens")
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # not no-referrer: Chromium then sends "Origin: null" on our own forms
    "X-Frame-Options": "DENY",
}


@dataclass
class Response:
    status: int
    body: bytes
    ctype: str = HTML
    headers: dict[str, str] = field(default_factory=dict)


class BadRequest(BrokerError):
    exit_code = 2


def _html(status: int, text: str, **headers: str) -> Response:
    return Response(status, text.encode(), HTML, dict(headers))


def _redirect(to: str, **headers: str) -> Response:
    return Response(303, b"", "text/plain; charset=utf-8", {"Location": to, **headers})


def serves(path: str) -> bool:
    """Whether ``path`` is one of the dashboard's."""
    return path in PAGES or (path.startswith("/jobs/") and path.count("/") == 2)


def _query(raw: str, allowed: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in parse_qsl(raw, keep_blank_values=True, max_num_fields=20):
        if key not in allowed:
            raise BadRequest(f"unknown query parameter {key[:40]!r}",
                             hint=("this page takes: " + ", ".join(allowed)) if allowed else "this page takes none")
        if key in out:
            raise BadRequest(f"{key} is given twice", hint="give each filter once")
        out[key] = value
    return out


def _page_number(query: str) -> int:
    """``?page=N`` (1 when absent): a whole number, else a refusal saying so."""
    raw = _query(query, ("page",)).get("page", "1")
    page = ascii_digits(raw, 9)
    if page is None or page < 1:
        raise BadRequest(f"page = {raw[:20]!r}: give a whole number from 1", hint="e.g. /admin/tokens?page=2")
    return page


def read_proxy_secret(path: str) -> bytes:
    """The secret in ``[web] proxy_secret_file``, a path the admin chose: a regular file
    owned by the daemon's user and readable by it alone, of ``MIN_SECRET`` characters or
    more, else a ConfigError saying how to make one."""
    hint = f"create it readable by root alone ({PROXY_SECRET_HOWTO.replace('FILE', path)})"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"[web] proxy_secret_file {path}: {exc.strerror}", hint=hint) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise ConfigError(f"[web] proxy_secret_file {path} is not a file only the daemon's user can read "
                              f"(owner uid {st.st_uid}, mode {st.st_mode & 0o777:04o})",
                              hint=f"chown root {path}; chmod 600 {path}")
        secret = os.read(fd, 4096).strip()
    finally:
        os.close(fd)
    if len(secret) < MIN_SECRET:
        raise ConfigError(f"[web] proxy_secret_file {path} holds under {MIN_SECRET} characters", hint=hint)
    return secret


class Dashboard:
    def __init__(self, svc: Services, ops: Mapping[str, Handler], caller_of: Callable[[int], Caller]) -> None:
        self.svc = svc
        self.ops = ops
        self.caller_of = caller_of
        """uid -> Caller, as the socket server makes it (admin from the admin group)."""
        self._secret: tuple[str, bytes] | None = None

    # -- who -----------------------------------------------------------------------------------
    def proxy_secret(self) -> bytes:
        """The proxy's secret, read once from ``[web] proxy_secret_file`` (the daemon calls
        this at start, so a missing or readable-by-others file stops it)."""
        path = self.svc.settings.web.proxy_secret_file
        if self._secret is None or self._secret[0] != path:
            self._secret = (path, read_proxy_secret(path))
        return self._secret[1]

    def _proxy_caller(self, headers: Mapping[str, str]) -> Caller | None:
        name_header = self.svc.settings.web.trust_proxy_header
        if not name_header:
            return None
        name = headers.get(name_header)
        if not name:
            return None
        sent = headers.get(PROXY_SECRET_HEADER) or ""
        if not hmac.compare_digest(sent.strip().encode(), self.proxy_secret()):
            raise PermissionDenied(f"this request names a user in {name_header} without the proxy's secret",
                                   hint="sign in with a gbroker token; only the reverse proxy may name users")
        try:
            uid = pwd.getpwnam(name.strip()).pw_uid
        except (KeyError, ValueError):
            raise PermissionDenied(f"the proxy says user {name.strip()[:64]!r}, who has no account here",
                                   hint="the proxy must send a Unix user name the daemon's host knows") from None
        return self.caller_of(uid)

    def caller(self, headers: Mapping[str, str]) -> Caller | None:
        proxied = self._proxy_caller(headers)
        if proxied is not None:
            return proxied
        session_id = auth.cookie_token(headers.get("Cookie"))
        if session_id is None:
            return None
        verdict = auth.verify_session(self.svc, session_id, self.svc.clock.now())
        return None if verdict.uid is None else self.caller_of(verdict.uid)

    # -- requests ------------------------------------------------------------------------------
    def get(self, target: str, headers: Mapping[str, str]) -> Response:
        parts = urlsplit(target)
        path = parts.path
        try:
            if path == "/login":
                _query(parts.query, ())
                return _html(200, pages.login_page())
            caller = self.caller(headers)
            if caller is None:
                return _redirect("/login")
            try:
                return self._page(caller, path, parts.query)
            except BrokerError as exc:
                return self._refused(exc, caller)
        except BrokerError as exc:
            return self._refused(exc, None)

    def post(self, path: str, headers: Mapping[str, str], body: bytes) -> Response:
        if not self._same_origin(headers):
            return _html(403, pages.error_page("Refused", "this form was sent from another site",
                                                "open the dashboard itself and sign in there"))
        if path == "/logout":
            return self._sign_out(headers)
        if path != "/login":
            return _html(405, pages.error_page("Read-only", "the dashboard only shows; nothing here changes"))
        if len(body) > MAX_FORM:
            return _html(413, pages.login_page("that form is too large for a token"))
        form = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=5))
        extra = sorted(set(form) - {"token"})
        if extra:
            return _html(400, pages.login_page(f"unknown form field {extra[0][:40]!r}: the form takes a token"))
        now = self.svc.clock.now()
        done = auth.sign_in(self.svc, form.get("token", ""), now)
        verdict = done.verdict
        if verdict.uid is None or verdict.expires_at is None or not done.session_id:
            log.info("dashboard sign-in refused: %s", verdict.why)
            return _html(401, pages.login_page(verdict.why))
        secure = headers.get("X-Forwarded-Proto", "").lower() == "https"
        max_age = int((verdict.expires_at - now) / timedelta(seconds=1))
        return _redirect("/jobs", **{"Set-Cookie": auth.cookie_header(done.session_id, max_age, secure)})

    def _sign_out(self, headers: Mapping[str, str]) -> Response:
        """End the browser's session on the server (a copy of its cookie opens nothing after), then clear it."""
        session_id = auth.cookie_token(headers.get("Cookie"))
        if session_id is not None:
            auth.sign_out(self.svc, session_id, self.svc.clock.now())
        return _redirect("/login", **{"Set-Cookie": auth.clear_cookie_header()})

    @staticmethod
    def _same_origin(headers: Mapping[str, str]) -> bool:
        """A browser's POST names its page's origin; it must be this host (no cross-site sign-in or sign-out)."""
        origin = headers.get("Origin")
        if origin is None or origin == "null":
            return origin is None
        host = headers.get("X-Forwarded-Host") if headers.get("X-Forwarded-Host") else headers.get("Host", "")
        return urlsplit(origin).netloc == host

    def _refused(self, exc: BrokerError, caller: Caller | None) -> Response:
        status = 404 if isinstance(exc, NotFound) else 403 if isinstance(exc, PermissionDenied) else 400
        if exc.exit_code not in (2, 3, 4):
            status = 503
        user, admin = (caller.name, caller.is_admin) if caller else (None, False)
        return _html(status, pages.error_page("Not shown", exc.message, exc.hint or "", user, admin))

    def _page(self, caller: Caller, path: str, query: str) -> Response:
        if path == "/":
            _query(query, ())
            return _redirect("/jobs")
        if path == "/jobs":
            return _html(200, self.jobs(caller, _query(query, JOB_FILTERS)))
        if path.startswith("/jobs/"):
            _query(query, ())
            raw = path.rsplit("/", 1)[1]
            job_id = ascii_digits(raw)
            if job_id is None:
                raise NotFound(f"no job {raw[:40]!r}", hint="job numbers are whole numbers: see /jobs")
            job = self.ops["show"](caller, {"job_id": job_id})
            return _html(200, pages.job_page(job, caller.name, caller.is_admin))
        if path == "/spend":
            return _html(200, self.spend(caller, _query(query, ("semester",))))
        if path == "/nodes":
            return _html(200, self.nodes(caller, _query(query, ("days",))))
        if path == "/admin/tokens":
            caller.require_admin("the sign-in tokens page")
            return _html(200, pages.tokens_page(auth.token_page(self.svc, caller, _page_number(query)), caller.name))
        raise NotFound(f"no page {path[:80]!r}", hint="see /jobs, /spend or /nodes")

    # -- pages ---------------------------------------------------------------------------------
    def jobs(self, caller: Caller, filters: dict[str, str]) -> str:
        want_user = filters.get("user", "")
        if want_user and want_user != caller.name and not caller.is_admin:
            raise PermissionDenied(f"user {want_user[:64]!r}'s jobs are not yours to see",
                                   hint="you see your own jobs; an admin sees everyone's")
        state = filters.get("state", "")
        states = [s.value for s in JobState]
        if state and state not in states:
            raise BadRequest(f"state {state[:40]!r} is not a job state", hint="states: " + ", ".join(states))
        pool_of = {p.partition: p.name for p in self.svc.settings.catalog().pools}
        groups = self.ops["group_list"](caller, {})
        users = sorted({m for g in groups for m in g["members"]} | {caller.name}) if caller.is_admin else [caller.name]
        choices = {"user": users, "group": sorted(g["name"] for g in groups), "state": states,
                   "pool": sorted(set(pool_of.values()))}
        want_pool = filters.get("pool", "")
        if want_pool and want_pool not in choices["pool"]:
            raise BadRequest(f"pool {want_pool[:40]!r} is not one of this lab's",
                             hint="pools: " + (", ".join(choices["pool"]) or "none configured"))
        # The database filters; the page shows the newest MAX_LIST that match.
        args: dict[str, Any] = {"active": False, "all_users": caller.is_admin, "limit": MAX_LIST}
        args.update({k: filters[k] for k in ("user", "group", "state") if filters.get(k)})
        if want_pool:
            args["partitions"] = sorted(p for p, name in pool_of.items() if name == want_pool)
        shown = self.ops["list"](caller, args)
        return pages.jobs_page(shown, filters, choices, caller.name, caller.is_admin, pool_of,
                               capped=MAX_LIST if len(shown) >= MAX_LIST else 0)

    def spend(self, caller: Caller, q: dict[str, str]) -> str:
        args = {"semester": q["semester"]} if q.get("semester") else {}
        try:
            burn = self.ops["burndown"](caller, dict(args))
        except BrokerError as exc:
            return pages.spend_page(None, None, None, exc.message + (f"\n{exc.hint}" if exc.hint else ""),
                                    caller.name, caller.is_admin)
        budgets = self.ops["budget_list"](caller, dict(args))
        report = self.ops["report"](caller, {**args, "by": "group"})
        return pages.spend_page(burn, budgets, report, "", caller.name, caller.is_admin)

    def nodes(self, caller: Caller, q: dict[str, str]) -> str:
        raw = q.get("days", "7")
        days = ascii_digits(raw, 3)
        if days is None or not 1 <= days <= 366:
            raise BadRequest(f"days = {raw[:20]!r}: give a whole number of days from 1 to 366", hint="e.g. /nodes?days=7")
        pools = self.ops["pools"](caller, {})["pools"]
        report = self.ops["node_report"](caller, {"since": f"-{days}d"})
        now = self.svc.clock.now()
        with self.svc.sessions() as s:
            per_node = node_time(s, now - timedelta(days=days), now)
        current: list[dict[str, Any]] | None
        try:
            current, problem = self.ops["node_list"](caller, {}), ""
        except BrokerError as exc:
            current, problem = None, f"Slurm did not answer: {exc.message}"
        return pages.nodes_page(pools, report["partitions"], per_node, current, problem, days, caller.name,
                                caller.is_admin)
