"""Job and attempt states, the allowed transitions, and which are terminal.

This is the only place state names are spelled. Slurm's own state strings are
mapped onto these in ``broker.slurm.statemap``.
"""

from __future__ import annotations

from enum import Enum


class JobState(str, Enum):
    """State of a gbroker job (one job may run as several Slurm attempts)."""

    ADMITTED = "admitted"
    """Accepted and stored; no Slurm job yet (intent recorded, sbatch not confirmed)."""
    PENDING = "pending"
    """A Slurm job exists and waits for nodes."""
    RUNNING = "running"
    """The current attempt runs."""
    COMPLETING = "completing"
    """Slurm is ending the current attempt (squeue COMPLETING): its program was signalled or
    ended, and Slurm waits for its node(s) to clean up; a node that stopped responding keeps it
    here until Slurm gives up on the node. Not running any more, not ended yet."""
    RECOVERING = "recovering"
    """The last attempt was reclaimed or preempted; the next one is being placed."""
    HELD = "held"
    """Held in Slurm by gbroker (budget stop) or by an admin."""
    UNKNOWN = "unknown"
    """Slurm did not answer, or said something we do not understand. Never a failure."""
    COMPLETED = "completed"
    """The program exited 0."""
    FAILED = "failed"
    """The program failed for its own reasons more often than the retry limit allows."""
    CANCELLED = "cancelled"
    """Cancelled by its owner or an admin."""
    TIMEOUT = "timeout"
    """Ran out of its time limit."""
    DEADLINE_MISSED = "deadline_missed"
    """Gave up: the deadline can no longer be met."""


BUDGET_HELD = "held by gbroker: the group is at its budget"
"""The reason of a job (or of an array's pieces) held for its group's budget."""

TERMINAL: frozenset[JobState] = frozenset(
    {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT, JobState.DEADLINE_MISSED}
)
ACTIVE: frozenset[JobState] = frozenset(JobState) - TERMINAL


class AttemptState(str, Enum):
    """State of one Slurm run of a job."""

    SUBMITTING = "submitting"
    """Intent stored; sbatch not yet confirmed."""
    PENDING = "pending"
    RUNNING = "running"
    MOVING = "moving"
    """Running on spot; gbroker is requeueing it onto on-demand to keep the deadline."""
    COMPLETED = "completed"
    FAILED = "failed"
    RECLAIMED = "reclaimed"
    """The node was taken back (NODE_FAIL on spot, or a cloud reclaim)."""
    PREEMPTED = "preempted"
    """Slurm preempted it for a higher-priority partition (requeue)."""
    MOVED = "moved"
    """gbroker took it off spot to keep the deadline (requeued onto on-demand)."""
    CONTINUED = "continued"
    """The program stopped to go on in a new run: it requeued itself (Lightning's
    auto_requeue) or exited 75 after saving. Neither a reclaim nor a failure; its
    work is kept."""
    LOST = "lost"
    """Slurm lost the run itself (its controller restarted while the run started, or it
    failed to launch it): neither a reclaim nor the program's failure. The job runs again."""
    BOOT_FAILED = "boot_failed"
    """Its node never came up (Slurm gave up waiting for the boot, ResumeTimeout, and failed
    the run): the program never started. Neither a reclaim nor lost work, and not charged;
    the job runs again, kept off a node that failed to boot for it twice."""
    WITHDRAWN = "withdrawn"
    """Taken back to the queue, held, before it started: its group reached its budget while
    its nodes booted, and gbroker requeued it held (a plain hold does not stop a job whose
    nodes are allocated). No work was done; not charged."""
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    UNKNOWN = "unknown"


ATTEMPT_TERMINAL: frozenset[AttemptState] = frozenset(
    {
        AttemptState.COMPLETED,
        AttemptState.FAILED,
        AttemptState.RECLAIMED,
        AttemptState.PREEMPTED,
        AttemptState.MOVED,
        AttemptState.LOST,
        AttemptState.BOOT_FAILED,
        AttemptState.WITHDRAWN,
        AttemptState.CONTINUED,
        AttemptState.CANCELLED,
        AttemptState.TIMEOUT,
    }
)

_J = JobState
ALLOWED: dict[JobState, frozenset[JobState]] = {
    _J.ADMITTED: frozenset(
        {_J.PENDING, _J.RUNNING, _J.RECOVERING, _J.CANCELLED, _J.UNKNOWN, _J.HELD, _J.FAILED, _J.DEADLINE_MISSED}
    ),
    _J.PENDING: frozenset(
        {_J.RUNNING, _J.COMPLETING, _J.HELD, _J.CANCELLED, _J.UNKNOWN, _J.RECOVERING} | TERMINAL
    ),
    _J.RUNNING: frozenset({_J.COMPLETING, _J.RECOVERING, _J.UNKNOWN, _J.PENDING, _J.HELD} | TERMINAL),
    _J.COMPLETING: frozenset({_J.RUNNING, _J.RECOVERING, _J.UNKNOWN, _J.PENDING, _J.HELD} | TERMINAL),
    _J.RECOVERING: frozenset({_J.PENDING, _J.RUNNING, _J.COMPLETING, _J.UNKNOWN, _J.HELD} | TERMINAL),
    _J.HELD: frozenset({_J.PENDING, _J.RUNNING, _J.COMPLETING, _J.RECOVERING, _J.UNKNOWN} | TERMINAL),
    _J.UNKNOWN: frozenset(ACTIVE | TERMINAL),
}
for _t in TERMINAL:
    ALLOWED[_t] = frozenset()


def can_move(src: JobState, dst: JobState) -> bool:
    return src == dst or dst in ALLOWED[src]


ATTEMPT_RUNNING: frozenset[AttemptState] = frozenset({AttemptState.RUNNING, AttemptState.MOVING})
"""An attempt whose run holds its nodes now (a moving one runs until Slurm has requeued it)."""

_A = AttemptState
_ENDS = ATTEMPT_TERMINAL - {_A.MOVED}
"""How any live attempt can end; only a moving one ends as moved."""
ATTEMPT_ALLOWED: dict[AttemptState, frozenset[AttemptState]] = {
    _A.SUBMITTING: frozenset({_A.PENDING, _A.RUNNING} | _ENDS),
    _A.PENDING: frozenset({_A.RUNNING} | _ENDS),
    _A.RUNNING: frozenset({_A.MOVING} | _ENDS),
    _A.MOVING: ATTEMPT_TERMINAL,
    _A.UNKNOWN: frozenset({_A.PENDING, _A.RUNNING} | _ENDS),
}
for _e in ATTEMPT_TERMINAL:
    ATTEMPT_ALLOWED[_e] = frozenset()


def can_move_attempt(src: AttemptState, dst: AttemptState) -> bool:
    """Whether an attempt may go from ``src`` to ``dst`` (staying put is no move)."""
    return src == dst or dst in ATTEMPT_ALLOWED[src]


class PieceState(str, Enum):
    """One piece of an array (one Slurm array task: a chunk of indices)."""

    WAITING = "waiting"
    """Not in Slurm: its batch is not submitted yet, or it waits for a retry batch."""
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    """Failed more than ``max_retries`` times; the array reports it."""
    CANCELLED = "cancelled"


PIECE_FINAL: frozenset[PieceState] = frozenset({PieceState.DONE, PieceState.FAILED, PieceState.CANCELLED})
_P = PieceState
PIECE_ALLOWED: dict[PieceState, frozenset[PieceState]] = {
    _P.WAITING: frozenset({_P.PENDING, _P.RUNNING} | PIECE_FINAL),
    _P.PENDING: frozenset({_P.RUNNING, _P.WAITING} | PIECE_FINAL),
    _P.RUNNING: frozenset({_P.PENDING, _P.WAITING} | PIECE_FINAL),
}
for _f in PIECE_FINAL:
    PIECE_ALLOWED[_f] = frozenset()


def can_move_piece(src: PieceState, dst: PieceState) -> bool:
    return src == dst or dst in PIECE_ALLOWED[src]


class NodeState(str, Enum):
    """Power and use state of a node, as gbroker sees it."""

    POWERED_DOWN = "powered_down"
    POWERING_UP = "powering_up"
    IDLE = "idle"
    ALLOCATED = "allocated"
    POWERING_DOWN = "powering_down"
    DOWN = "down"
    UNKNOWN = "unknown"
