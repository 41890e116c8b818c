"""The dashboard's sign-in tokens: only a SHA-256 of each token is stored, never the token.

``gbroker token`` asks the daemon (over the UNIX socket, so the uid is the
kernel's) to mint one; the browser shows it once and the dashboard compares
hashes (``broker/web/auth.py``). A token ends when it expires or is revoked;
its row stays, so ``gbroker token --list`` can say which ended and why.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from broker.db.models import NAME_LEN, Base


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
