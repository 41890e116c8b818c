"""Dashboard sign-in: tokens minted over the UNIX socket, stored as SHA-256, checked with compare_digest.

``gbroker token`` calls ``token_mint``; the daemon takes the uid from
SO_PEERCRED (the ``Caller``), never from the request, so a token is bound to
the kernel-verified user. The token text is shown once; the database keeps
only its hash. A token ends at ``expires_at`` or when revoked (by its owner
or an admin); its row stays for ``token_list``.

The browser pastes the token into the login form and gets it back as an
HttpOnly, SameSite=Strict cookie (``cookie_header``); each request hashes the
cookie and looks the hash up (``verify``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from http.cookies import CookieError, SimpleCookie
from typing import Any

from sqlalchemy import select

from broker.caller import Caller, Handler, bool_arg, int_arg, only_args
from broker.db.web_models import WebToken
from broker.errors import NotFound, SpecError
from broker.state import Services

TOKEN_PREFIX = "gbt_"
COOKIE = "gbroker_session"
DEFAULT_TTL_S = 12 * 3600
MIN_TTL_S = 60
MAX_TTL_S = 30 * 86400
NOTE_LEN = 64
MAX_TOKEN_LEN = 200
"""Longer text is not one of ours; refused before hashing."""


def hash_token(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Verdict:
    uid: int | None
    """The token's owner; None when refused."""
    why: str = ""
    """Why refused, in words the login page shows."""
    expires_at: datetime | None = None


def verify(svc: Services, text: str, now: datetime) -> Verdict:
    """Whose token this is, if it is a live one."""
    text = text.strip()
    if not text.startswith(TOKEN_PREFIX) or len(text) > MAX_TOKEN_LEN:
        return Verdict(None, "that is not a gbroker token (they start with gbt_): run `gbroker token`")
    digest = hash_token(text)
    with svc.sessions() as s:
        row = s.execute(select(WebToken).where(WebToken.token_sha256 == digest)).scalar_one_or_none()
        if row is None or not hmac.compare_digest(row.token_sha256, digest):
            return Verdict(None, "unknown token: run `gbroker token` for a new one")
        if row.revoked_at is not None:
            return Verdict(None, f"token {row.id} was revoked: run `gbroker token` for a new one")
        if row.expires_at <= now:
            return Verdict(None, f"token {row.id} expired: run `gbroker token` for a new one")
        return Verdict(row.owner_uid, expires_at=row.expires_at)


def mark_used(svc: Services, text: str, now: datetime) -> None:
    """Note a sign-in with the token (shown by ``token_list``)."""
    with svc.tx() as s:
        row = s.execute(select(WebToken).where(WebToken.token_sha256 == hash_token(text.strip()))).scalar_one_or_none()
        if row is not None:
            row.last_used_at = now


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


def cookie_header(token: str, max_age_s: int, secure: bool) -> str:
    """Set-Cookie for a signed-in browser: HttpOnly (no script reads it), SameSite=Strict (no other site sends it)."""
    if not token.startswith(TOKEN_PREFIX) or not token[len(TOKEN_PREFIX):].replace("-", "").replace("_", "").isalnum():
        raise ValueError("not a token")
    parts = [f"{COOKIE}={token}", "Path=/", "HttpOnly", "SameSite=Strict", f"Max-Age={max(0, int(max_age_s))}"]
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


def mint(svc: Services, caller: Caller, ttl_s: int = DEFAULT_TTL_S, note: str = "") -> dict[str, Any]:
    now = svc.clock.now()
    text = new_token()
    with svc.tx() as s:
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


def revoke(svc: Services, caller: Caller, token_id: int) -> dict[str, Any]:
    now = svc.clock.now()
    with svc.tx() as s:
        row = s.get(WebToken, token_id)
        if row is None or (row.owner_uid != caller.uid and not caller.is_admin):
            raise NotFound(f"no token {token_id} of yours", hint="`gbroker token --list` shows your tokens")
        if row.revoked_at is None:
            row.revoked_at = now
            row.revoked_by = caller.name
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
