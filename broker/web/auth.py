"""Dashboard sign-in: tokens minted over the UNIX socket, browser sessions opened with them.

``gbroker token`` calls ``token_mint``; the daemon takes the uid from
SO_PEERCRED (the ``Caller``), never from the request, so a token is bound to
the kernel-verified user. The token text is shown once; the database keeps
only its hash. A token ends at ``expires_at`` or when revoked (by its owner
or an admin); its row stays for ``token_list``. One user holds at most
``[web] max_tokens_per_user`` live tokens, and the oldest ended ones are
deleted as new ones are made, so no user can grow the table without end.

The browser pastes the token into the login form (``sign_in``); the daemon
opens a session and the browser gets the session's random id back as an
HttpOnly, SameSite=Strict cookie (``cookie_header``), never the token. Each
request hashes the cookie and finds a live session of a live token
(``verify_session``). Signing out (``sign_out``) or revoking the token ends
the session on the server, so a copy of the cookie opens nothing after it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from http.cookies import CookieError, SimpleCookie
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from broker.caller import Caller, Handler, bool_arg, int_arg, only_args
from broker.db.web_models import WebSession, WebToken
from broker.errors import AdmissionRefused, NotFound, SpecError
from broker.state import Services

TOKEN_PREFIX = "gbt_"
SESSION_PREFIX = "gbs_"
COOKIE = "gbroker_session"
DEFAULT_TTL_S = 12 * 3600
MIN_TTL_S = 60
MAX_TTL_S = 30 * 86400
NOTE_LEN = 64
MAX_TOKEN_LEN = 200
"""Longer text is not one of ours; refused before hashing."""
MAX_SESSIONS_PER_TOKEN = 10
"""Browsers signed in with one token at once; the next sign-in ends the oldest (each session is a row)."""
KEEP_ENDED_TOKENS = 20
"""Ended tokens of a user that ``--list`` still shows; older ones (and their sessions) are deleted when the
user makes a new one, so revoking and minting again does not grow the table."""
TOKENS_PER_PAGE = 50
"""Rows the admin tokens page shows at once."""
def hash_token(text: str) -> str:
    """SHA-256 of a token or a session id, as stored (the secrets themselves never are)."""
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def new_session_id() -> str:
    return SESSION_PREFIX + secrets.token_urlsafe(32)


def _ours(text: str, prefix: str) -> bool:
    """Whether ``text`` has the shape of one of our secrets (checked before any hashing or lookup)."""
    body = text[len(prefix):]
    return (text.startswith(prefix) and len(text) <= MAX_TOKEN_LEN and bool(body)
            and body.replace("-", "").replace("_", "").isalnum() and body.isascii())


@dataclass(frozen=True)
class Verdict:
    uid: int | None
    """The token's owner; None when refused."""
    why: str = ""
    """Why refused, in words the login page shows."""
    expires_at: datetime | None = None


def _token_ended(row: WebToken, now: datetime) -> str:
    """Why a token no longer signs anyone in ('' while it does)."""
    if row.revoked_at is not None:
        return f"token {row.id} was revoked: run `gbroker token` for a new one"
    if row.expires_at <= now:
        return f"token {row.id} expired: run `gbroker token` for a new one"
    return ""


def _find_token(s: Session, text: str) -> WebToken | None:
    digest = hash_token(text)
    row = s.execute(select(WebToken).where(WebToken.token_sha256 == digest)).scalar_one_or_none()
    return row if row is not None and hmac.compare_digest(row.token_sha256, digest) else None


def _token_verdict(row: WebToken | None, now: datetime) -> Verdict:
    if row is None:
        return Verdict(None, "unknown token: run `gbroker token` for a new one")
    why = _token_ended(row, now)
    return Verdict(None, why) if why else Verdict(row.owner_uid, expires_at=row.expires_at)


def verify(svc: Services, text: str, now: datetime) -> Verdict:
    """Whose token this is, if it is a live one."""
    text = text.strip()
    if not _ours(text, TOKEN_PREFIX):
        return Verdict(None, "that is not a gbroker token (they start with gbt_): run `gbroker token`")
    with svc.sessions() as s:
        return _token_verdict(_find_token(s, text), now)


# -- browser sessions ---------------------------------------------------------------------------
@dataclass(frozen=True)
class SignIn:
    verdict: Verdict
    session_id: str = ""
    """The cookie's value: a new random id, '' when the sign-in was refused."""


def sign_in(svc: Services, text: str, now: datetime) -> SignIn:
    """Open a browser session with a live token: a new session id, bound to the token and its owner."""
    text = text.strip()
    if not _ours(text, TOKEN_PREFIX):
        return SignIn(Verdict(None, "that is not a gbroker token (they start with gbt_): run `gbroker token`"))
    session_id = new_session_id()
    with svc.tx() as s:
        row = _find_token(s, text)
        verdict = _token_verdict(row, now)
        if row is None or verdict.uid is None:
            return SignIn(verdict)
        _make_room(s, row.id, now)
        s.add(WebSession(session_sha256=hash_token(session_id), token_id=row.id, owner_uid=row.owner_uid,
                         created_at=now, expires_at=row.expires_at, ended_why=""))
        row.last_used_at = now
    return SignIn(verdict, session_id)


def _make_room(s: Session, token_id: int, now: datetime) -> None:
    """Delete the token's ended sessions and end its oldest live ones past ``MAX_SESSIONS_PER_TOKEN`` - 1,
    so signing in again and again keeps a bounded number of rows."""
    s.execute(delete(WebSession).where(WebSession.token_id == token_id,
                                       (WebSession.ended_at.is_not(None)) | (WebSession.expires_at <= now)))
    live = s.execute(select(WebSession).where(WebSession.token_id == token_id)
                     .order_by(WebSession.id.desc()).offset(MAX_SESSIONS_PER_TOKEN - 1)).scalars()
    for old in live:
        old.ended_at, old.ended_why = now, "a newer sign-in with the same token"


def verify_session(svc: Services, text: str, now: datetime) -> Verdict:
    """Whose browser this cookie signs in: a live session of a live token, of the same owner."""
    if not _ours(text, SESSION_PREFIX):
        return Verdict(None, "not a dashboard session: sign in with a `gbroker token`")
    digest = hash_token(text)
    with svc.sessions() as s:
        found = s.execute(select(WebSession, WebToken).join(WebToken, WebToken.id == WebSession.token_id)
                          .where(WebSession.session_sha256 == digest)).one_or_none()
        if found is None or not hmac.compare_digest(found[0].session_sha256, digest):
            return Verdict(None, "that session is unknown or has ended: sign in again")
        session, token = found
        if session.ended_at is not None or session.expires_at <= now:
            return Verdict(None, "that session has ended: sign in again")
        if session.owner_uid != token.owner_uid:
            return Verdict(None, "that session does not match its token: sign in again")
        return _token_verdict(token, now)


def sign_out(svc: Services, text: str, now: datetime) -> bool:
    """End the cookie's session on the server; whether there was a live one to end."""
    if not _ours(text, SESSION_PREFIX):
        return False
    with svc.tx() as s:
        done = s.execute(update(WebSession).where(WebSession.session_sha256 == hash_token(text),
                                                  WebSession.ended_at.is_(None))
                         .values(ended_at=now, ended_why="signed out"))
        return bool(getattr(done, "rowcount", 0))


def cookie_token(header: str | None) -> str | None:
    """The session cookie's value from a Cookie header; None when there is none (or it is unreadable)."""
    if not header:
        return None
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except CookieError:
        return None
    morsel = jar.get(COOKIE)
    return morsel.value if morsel is not None and morsel.value else None


def cookie_header(session_id: str, max_age_s: int, secure: bool) -> str:
    """Set-Cookie for a signed-in browser: HttpOnly (no script reads it), SameSite=Strict (no other site sends it)."""
    if not _ours(session_id, SESSION_PREFIX):
        raise ValueError("not a session id")
    parts = [f"{COOKIE}={session_id}", "Path=/", "HttpOnly", "SameSite=Strict", f"Max-Age={max(0, int(max_age_s))}"]
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


def clear_cookie_header() -> str:
    return f"{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"


# -- the socket operations ----------------------------------------------------------------------
def _iso(dt: datetime | None) -> str | None:
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ") if dt is not None else None


def _status(row: WebToken, now: datetime) -> str:
    if row.revoked_at is not None:
        return "revoked"
    return "expired" if row.expires_at <= now else "active"


def token_dict(row: WebToken, now: datetime) -> dict[str, Any]:
    return {
        "id": row.id, "user": row.owner_name, "uid": row.owner_uid, "note": row.note,
        "created_at": _iso(row.created_at), "expires_at": _iso(row.expires_at),
        "revoked_at": _iso(row.revoked_at), "revoked_by": row.revoked_by,
        "last_used_at": _iso(row.last_used_at), "status": _status(row, now),
    }


def _live(uid: int, now: datetime) -> Any:
    return (WebToken.owner_uid == uid) & WebToken.revoked_at.is_(None) & (WebToken.expires_at > now)


def _check_cap(s: Session, caller: Caller, cap: int, now: datetime) -> None:
    """Refuse a token past the user's cap of live ones, saying how to end one."""
    live = s.execute(select(func.count()).select_from(WebToken).where(_live(caller.uid, now))).scalar_one()
    if live >= cap:
        raise AdmissionRefused(
            f"{caller.name} holds {live} live dashboard tokens, the most one user may ([web] max_tokens_per_user "
            f"= {cap})",
            hint="end one you no longer use: `gbroker token --list` shows them, `gbroker token --revoke ID` "
                 "ends one (or wait for one to expire)")


def _prune_ended(s: Session, uid: int, now: datetime) -> None:
    """Delete the user's ended tokens past the newest ``KEEP_ENDED_TOKENS``, and their sessions."""
    old = select(WebToken.id).where(WebToken.owner_uid == uid, ~_live(uid, now)).order_by(
        WebToken.id.desc()).offset(KEEP_ENDED_TOKENS)
    ids = list(s.execute(old).scalars())
    if ids:
        s.execute(delete(WebSession).where(WebSession.token_id.in_(ids)))
        s.execute(delete(WebToken).where(WebToken.id.in_(ids)))


def mint(svc: Services, caller: Caller, ttl_s: int = DEFAULT_TTL_S, note: str = "") -> dict[str, Any]:
    now = svc.clock.now()
    text = new_token()
    with svc.tx() as s:  # the daemon's write lock: two mints at once cannot both take the last place
        _check_cap(s, caller, svc.settings.web.max_tokens_per_user, now)
        _prune_ended(s, caller.uid, now)
        row = WebToken(token_sha256=hash_token(text), owner_uid=caller.uid, owner_name=caller.name, note=note,
                       created_at=now, expires_at=now + timedelta(seconds=ttl_s), revoked_by="")
        s.add(row)
        s.flush()
        out = token_dict(row, now)
    out["token"] = text
    return out


def list_tokens(svc: Services, caller: Caller, all_users: bool = False) -> list[dict[str, Any]]:
    if all_users:
        caller.require_admin("listing every user's dashboard tokens")
    now = svc.clock.now()
    with svc.sessions() as s:
        q = select(WebToken).order_by(WebToken.id)
        if not all_users:
            q = q.where(WebToken.owner_uid == caller.uid)
        return [token_dict(r, now) for r in s.execute(q).scalars()]


@dataclass(frozen=True)
class TokenPage:
    rows: list[dict[str, Any]]
    page: int
    """1 for the newest tokens."""
    pages: int
    total: int


def token_page(svc: Services, caller: Caller, page: int, per_page: int = TOKENS_PER_PAGE) -> TokenPage:
    """One page of every user's tokens, newest first (the admin page; it never reads every row)."""
    caller.require_admin("listing every user's dashboard tokens")
    now = svc.clock.now()
    with svc.sessions() as s:
        total = s.execute(select(func.count()).select_from(WebToken)).scalar_one()
        pages = max(1, -(-total // per_page))
        page = min(max(1, page), pages)
        q = select(WebToken).order_by(WebToken.id.desc()).offset((page - 1) * per_page).limit(per_page)
        return TokenPage([token_dict(r, now) for r in s.execute(q).scalars()], page, pages, total)


def revoke(svc: Services, caller: Caller, token_id: int) -> dict[str, Any]:
    """End a token and every browser session opened with it."""
    now = svc.clock.now()
    with svc.tx() as s:
        row = s.get(WebToken, token_id)
        if row is None or (row.owner_uid != caller.uid and not caller.is_admin):
            raise NotFound(f"no token {token_id} of yours", hint="`gbroker token --list` shows your tokens")
        if row.revoked_at is None:
            row.revoked_at = now
            row.revoked_by = caller.name
        s.execute(update(WebSession).where(WebSession.token_id == token_id, WebSession.ended_at.is_(None))
                  .values(ended_at=now, ended_why="token revoked"))
        return token_dict(row, now)


def handlers(svc: Services) -> dict[str, Handler]:
    """token_mint, token_list, token_revoke: the caller is the kernel's, every argument is checked."""

    def do_mint(caller: Caller, args: dict[str, Any]) -> Any:
        only_args(args, "token_mint", "ttl_s", "note")
        ttl = args.get("ttl_s", DEFAULT_TTL_S)
        if isinstance(ttl, int) and not isinstance(ttl, bool) and not MIN_TTL_S <= ttl <= MAX_TTL_S:
            raise SpecError(f"--ttl: a token lives between 1 minute and 30 days, not {ttl} s",
                            hint="e.g. --ttl 12h (the default) or --ttl 7d")
        ttl = int_arg(ttl, "ttl_s", MIN_TTL_S, MAX_TTL_S)
        note = args.get("note", "")
        if not isinstance(note, str) or len(note) > NOTE_LEN or any(not c.isprintable() for c in note):
            raise SpecError(f"--note: at most {NOTE_LEN} printable characters")
        return mint(svc, caller, ttl, note)

    def do_list(caller: Caller, args: dict[str, Any]) -> Any:
        only_args(args, "token_list", "all_users")
        return list_tokens(svc, caller, bool_arg(args.get("all_users", False), "all_users"))

    def do_revoke(caller: Caller, args: dict[str, Any]) -> Any:
        only_args(args, "token_revoke", "token_id")
        return revoke(svc, caller, int_arg(args.get("token_id"), "token_id", 1, 2**31 - 1))

    return {"token_mint": do_mint, "token_list": do_list, "token_revoke": do_revoke}
