"""The tables of arrays: each piece's state, and each Slurm array submitted for them.

An array is one ``jobs`` row with ``array_batches``. Its pieces are
``array_pieces`` rows (one per Slurm array task, a chunk of indices), its
Slurm submissions ``array_batches`` rows: the first batch holds every piece,
a later one the pieces that failed and are retried. Every ended run of a
piece is an ``attempts`` row whose ``slurm_job_id`` is the task's own Slurm
id (sacct's JobIDRaw), so the ledger charges it like any run, useful or lost.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from broker.db import models as _models  # noqa: F401  (the jobs table their foreign keys name)
from broker.db.base import NAME_LEN, Base
from broker.db.types import EnumText
from broker.states import PieceState
from policies.base import Capacity


class ArrayBatch(Base):
    """One Slurm job array submitted for some pieces of an array job (intent before sbatch)."""

    __tablename__ = "array_batches"
    __table_args__ = (UniqueConstraint("job_id", "number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    """1 for the whole array, 2.. for retries; the Slurm job name is ``<key>-a<number>``."""
    indices: Mapped[str] = mapped_column(Text)
    """The task indices, compressed (``1-40`` or ``3,7``)."""
    slurm_array_id: Mapped[int | None] = mapped_column(BigInteger, index=True)
    partition: Mapped[str | None] = mapped_column(String(NAME_LEN))
    capacity: Mapped[Capacity] = mapped_column(EnumText(Capacity, 16))
    created_at: Mapped[datetime]
    submitted_at: Mapped[datetime | None]


class ArrayPiece(Base):
    """One piece of an array: one Slurm array task, running the indices ``idx`` to ``last``."""

    __tablename__ = "array_pieces"
    __table_args__ = (
        UniqueConstraint("job_id", "idx"),
        # The tick's counts per state and its look-ups of waiting pieces by index, from the index alone.
        Index("ix_array_pieces_job_state_idx", "job_id", "state", "idx"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    idx: Mapped[int] = mapped_column(Integer)
    """The array task index (the chunk's first index): ``GBROKER_PIECE``."""
    last: Mapped[int] = mapped_column(Integer)
    state: Mapped[PieceState] = mapped_column(EnumText(PieceState, 16), index=True)
    batch: Mapped[int] = mapped_column(Integer, default=1)
    """The batch (``ArrayBatch.number``) whose Slurm array runs it now."""
    runs: Mapped[int] = mapped_column(Integer, default=0)
    """Runs of its current Slurm task that are settled (Slurm's restart count once seen)."""
    failures: Mapped[int] = mapped_column(Integer, default=0)
    reclaims: Mapped[int] = mapped_column(Integer, default=0)
    nodes: Mapped[str] = mapped_column(Text, default="")
    started_at: Mapped[datetime | None]
    exit_code: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(Text, default="")
    updated_at: Mapped[datetime]
