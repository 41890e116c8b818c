"""The dashboard's sign-in tokens and browser sessions: only SHA-256 hashes are stored, never the secrets.

``gbroker token`` asks the daemon (over the UNIX socket, so the uid is the
kernel's) to mint one; the browser shows it once and the dashboard compares
hashes (``broker/web/auth.py``). A token ends when it expires or is revoked;
its row stays, so ``gbroker token --list`` can say which ended and why.

Signing in with a token opens a ``WebSession``: the browser's cookie holds
the session's own random id, not the token, so signing out (or revoking the
token) ends that cookie on the server, whatever the browser keeps.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from broker.db.base import NAME_LEN, Base


class WebToken(Base):
    __tablename__ = "web_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    """Hex SHA-256 of the token text; the token itself is shown once and never stored."""
    owner_uid: Mapped[int] = mapped_column(Integer, index=True)
    owner_name: Mapped[str] = mapped_column(String(NAME_LEN))
    note: Mapped[str] = mapped_column(String(NAME_LEN), default="")
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]
    revoked_by: Mapped[str] = mapped_column(String(NAME_LEN), default="")
    last_used_at: Mapped[datetime | None]


class WebSession(Base):
    """One browser signed in with a token: live until it expires, its owner signs out, or the token ends."""

    __tablename__ = "web_sessions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    session_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    """Hex SHA-256 of the cookie's session id; a copy of the database opens no browser session."""
    token_id: Mapped[int] = mapped_column(ForeignKey("web_tokens.id"), index=True)
    owner_uid: Mapped[int] = mapped_column(Integer)
    """The token's owner when the session began (checked again against the token on every request)."""
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    """The token's expiry: a session never outlives the token it was opened with."""
    ended_at: Mapped[datetime | None]
    ended_why: Mapped[str] = mapped_column(String(NAME_LEN), default="")
