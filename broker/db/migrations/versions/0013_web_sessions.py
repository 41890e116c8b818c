"""Dashboard browser sessions.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07

``web_sessions``: one row per sign-in to the dashboard. The browser's cookie
holds a random session id (the row keeps only its SHA-256), not the token it
signed in with, so signing out ends the session on the server and a copy of
the cookie opens nothing after it. Cookies made before this revision held
the token itself; they are no longer read, so those browsers sign in again.
Downgrade drops the table (every browser signs in again).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "web_sessions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("session_sha256", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=False),
        sa.Column("owner_uid", sa.Integer(), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("expires_at", TZ, nullable=False),
        sa.Column("ended_at", TZ, nullable=True),
        sa.Column("ended_why", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(["token_id"], ["web_tokens.id"], name=op.f("fk_web_sessions_token_id_web_tokens")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_web_sessions")),
        sa.UniqueConstraint("session_sha256", name=op.f("uq_web_sessions_session_sha256")),
    )
    op.create_index(op.f("ix_web_sessions_token_id"), "web_sessions", ["token_id"])


def downgrade() -> None:
    op.drop_table("web_sessions")
