"""Dashboard sign-in tokens.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02

``web_tokens``: one row per token ``gbroker token`` minted, holding only the
token's SHA-256, its owner (uid from the kernel), expiry and revocation.
Downgrade drops it (every token ends).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "web_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("token_sha256", sa.String(length=64), nullable=False),
        sa.Column("owner_uid", sa.Integer(), nullable=False),
        sa.Column("owner_name", sa.String(length=64), nullable=False),
        sa.Column("note", sa.String(length=64), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("expires_at", TZ, nullable=False),
        sa.Column("revoked_at", TZ, nullable=True),
        sa.Column("revoked_by", sa.String(length=64), nullable=False),
        sa.Column("last_used_at", TZ, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_web_tokens")),
        sa.UniqueConstraint("token_sha256", name=op.f("uq_web_tokens_token_sha256")),
    )
    op.create_index(op.f("ix_web_tokens_owner_uid"), "web_tokens", ["owner_uid"])


def downgrade() -> None:
    op.drop_table("web_tokens")
