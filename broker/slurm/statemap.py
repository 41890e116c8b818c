"""The one table from Slurm's state strings to ours (design principle 6).

Every Slurm job state string maps to an :class:`AttemptState`; every node
state string (compact ``idle~``, long ``IDLE~`` or complete
``IDLE+CLOUD+POWERED_DOWN``) maps to a :class:`NodeState`. Nothing else in
gbroker spells a Slurm state.

An unknown string maps to UNKNOWN and logs a warning. It never maps to
COMPLETED: a job we do not understand is a job we must keep watching.

The strings come from Slurm's ``job_state_string`` / ``node_state_string*``
(22.05, 24.11 and 26.05 print the same names; they differ in which flags a
node carries when, see docs/DEVCLUSTER.md "Slurm releases").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from broker.states import AttemptState, NodeState

log = logging.getLogger(__name__)

_A = AttemptState

JOB_STATES: dict[str, AttemptState] = {
    # Waiting.
    "PENDING": _A.PENDING,
    "RESV_DEL_HOLD": _A.PENDING,  # held because its reservation was deleted; still queued
    # Holding an allocation: the attempt is live (and billed) until Slurm says how it ended.
    "CONFIGURING": _A.RUNNING,  # nodes allocated, still booting (cloud resume)
    "RUNNING": _A.RUNNING,
    "COMPLETING": _A.RUNNING,  # exit code not final yet; never guess COMPLETED
    "RESIZING": _A.RUNNING,
    "SIGNALING": _A.RUNNING,
    "STAGE_OUT": _A.RUNNING,  # burst-buffer stage-out after the program ended
    "SUSPENDED": _A.RUNNING,  # keeps its allocation; resumes later
    "STOPPED": _A.RUNNING,  # SIGSTOPped, keeps its CPUs
    # Ended.
    "COMPLETED": _A.COMPLETED,
    "FAILED": _A.FAILED,
    "OUT_OF_MEMORY": _A.FAILED,
    "SPECIAL_EXIT": _A.FAILED,  # an epilog decided the exit was special; held for a human
    "CANCELLED": _A.CANCELLED,
    "REVOKED": _A.CANCELLED,  # federation: this sibling was withdrawn
    "TIMEOUT": _A.TIMEOUT,
    "DEADLINE": _A.TIMEOUT,  # hit its --deadline: ran out of time, not a program error
    # The node went away under the job: not the program's fault.
    "NODE_FAIL": _A.RECLAIMED,
    "BOOT_FAIL": _A.RECLAIMED,  # the node never came up
    # Stopped by Slurm to give way; the job itself goes on.
    "PREEMPTED": _A.PREEMPTED,
    "REQUEUED": _A.PREEMPTED,
    "REQUEUE_FED": _A.PREEMPTED,
    "REQUEUE_HOLD": _A.PREEMPTED,
}
"""Every job state Slurm prints (squeue ``%T``/``State``, sacct ``State``)."""

JOB_STATE_CODES: dict[str, str] = {
    "BF": "BOOT_FAIL", "CA": "CANCELLED", "CD": "COMPLETED", "CF": "CONFIGURING",
    "CG": "COMPLETING", "DL": "DEADLINE", "F": "FAILED", "NF": "NODE_FAIL",
    "OOM": "OUT_OF_MEMORY", "PD": "PENDING", "PR": "PREEMPTED", "R": "RUNNING",
    "RD": "RESV_DEL_HOLD", "RF": "REQUEUE_FED", "RH": "REQUEUE_HOLD", "RQ": "REQUEUED",
    "RS": "RESIZING", "RV": "REVOKED", "SI": "SIGNALING", "SE": "SPECIAL_EXIT",
    "SO": "STAGE_OUT", "ST": "STOPPED", "S": "SUSPENDED", "TO": "TIMEOUT",
}  # fmt: skip
"""squeue's compact codes (``%t``), in case a caller hands one over."""


def normalize_job_state(raw: str) -> str:
    """The bare state name: ``"CANCELLED by 0"`` -> ``"CANCELLED"``, ``"R"`` -> ``"RUNNING"``."""
    word = raw.strip().split(" ", 1)[0].rstrip("+").upper()
    return JOB_STATE_CODES.get(word, word)


def job_state(raw: str) -> AttemptState:
    """Map one Slurm job state string; unknown -> UNKNOWN with a warning."""
    name = normalize_job_state(raw)
    state = JOB_STATES.get(name)
    if state is None:
        log.warning("unknown Slurm job state %r; treating the attempt as UNKNOWN", raw)
        return AttemptState.UNKNOWN
    return state


FAILURE_HOLD_REASONS: frozenset[str] = frozenset({"launch failed requeued held"})
"""Pending reasons of a job that Slurm requeued *and held* after failing to start it
itself: a node that failed at launch, a prolog error, or a controller restarted
while the job was starting. Nobody asked for the hold; gbroker releases it.
squeue prints the words, scontrol the same with underscores."""


def is_failure_hold(reason: str | None) -> bool:
    """True for a pending reason that says Slurm held the job after its own launch failure."""
    return (reason or "").strip().lower().replace("_", " ") in FAILURE_HOLD_REASONS


# ---------------------------------------------------------------------------
# Nodes
# ---------------------------------------------------------------------------

# Flag names as ``StateComplete`` / ``scontrol show node`` print them.
FLAG_CLOUD = "CLOUD"
FLAG_COMPLETING = "COMPLETING"
FLAG_DRAIN = "DRAIN"
FLAG_FAIL = "FAIL"
FLAG_INVALID_REG = "INVALID_REG"
FLAG_MAINT = "MAINTENANCE"
FLAG_NOT_RESPONDING = "NOT_RESPONDING"
FLAG_PLANNED = "PLANNED"
FLAG_POWER_DOWN = "POWER_DOWN"  # pending power down ("!")
FLAG_POWER_UP = "POWER_UP"  # power up requested, not yet started
FLAG_POWERED_DOWN = "POWERED_DOWN"  # "~"
FLAG_POWERING_DOWN = "POWERING_DOWN"  # "%"
FLAG_POWERING_UP = "POWERING_UP"  # "#"
FLAG_REBOOT_ISSUED = "REBOOT_ISSUED"
FLAG_REBOOT_REQUESTED = "REBOOT_REQUESTED"
FLAG_RESERVED = "RESERVED"
FLAG_PERFCTRS = "PERFCTRS"
FLAG_BLOCKED = "BLOCKED"

KNOWN_NODE_FLAGS: frozenset[str] = frozenset(
    {
        FLAG_CLOUD, FLAG_COMPLETING, FLAG_DRAIN, FLAG_FAIL, FLAG_INVALID_REG, FLAG_MAINT,
        FLAG_NOT_RESPONDING, FLAG_PLANNED, FLAG_POWER_DOWN, FLAG_POWER_UP, FLAG_POWERED_DOWN,
        FLAG_POWERING_DOWN, FLAG_POWERING_UP, FLAG_REBOOT_ISSUED, FLAG_REBOOT_REQUESTED,
        FLAG_RESERVED, FLAG_PERFCTRS, FLAG_BLOCKED,
        "DYNAMIC_FUTURE", "DYNAMIC_NORM", "RESUME", "NET", "DYNAMIC",
    }
)  # fmt: skip

NODE_SUFFIXES: dict[str, str] = {
    "*": FLAG_NOT_RESPONDING,
    "~": FLAG_POWERED_DOWN,
    "#": FLAG_POWERING_UP,
    "!": FLAG_POWER_DOWN,
    "%": FLAG_POWERING_DOWN,
    "$": FLAG_MAINT,
    "@": FLAG_REBOOT_REQUESTED,
    "^": FLAG_REBOOT_ISSUED,
    "-": FLAG_PLANNED,
    "+": FLAG_COMPLETING,  # only ever seen as "alloc+"
}
"""sinfo's one-character suffixes (at most one is printed)."""

# Base state words. Compact (sinfo %t) and long (sinfo %T, scontrol) spellings
# both appear; a word may imply flags (``drng`` is allocated + drain).
BASE_IDLE, BASE_ALLOC, BASE_MIXED, BASE_DOWN, BASE_FUTURE, BASE_UNKNOWN, BASE_ERROR = (
    "IDLE", "ALLOCATED", "MIXED", "DOWN", "FUTURE", "UNKNOWN", "ERROR",
)  # fmt: skip

NODE_WORDS: dict[str, tuple[str, frozenset[str]]] = {
    "idle": (BASE_IDLE, frozenset()),
    "alloc": (BASE_ALLOC, frozenset()),
    "allocated": (BASE_ALLOC, frozenset()),
    "mix": (BASE_MIXED, frozenset()),
    "mixed": (BASE_MIXED, frozenset()),
    "down": (BASE_DOWN, frozenset()),
    "error": (BASE_ERROR, frozenset()),
    "futr": (BASE_FUTURE, frozenset()),
    "future": (BASE_FUTURE, frozenset()),
    "unk": (BASE_UNKNOWN, frozenset()),
    "unknown": (BASE_UNKNOWN, frozenset()),
    "comp": (BASE_IDLE, frozenset({FLAG_COMPLETING})),
    "completing": (BASE_IDLE, frozenset({FLAG_COMPLETING})),
    "drain": (BASE_IDLE, frozenset({FLAG_DRAIN})),
    "drained": (BASE_IDLE, frozenset({FLAG_DRAIN})),
    "drng": (BASE_ALLOC, frozenset({FLAG_DRAIN})),
    "draining": (BASE_ALLOC, frozenset({FLAG_DRAIN})),
    "fail": (BASE_IDLE, frozenset({FLAG_FAIL})),
    "failg": (BASE_ALLOC, frozenset({FLAG_FAIL})),
    "failing": (BASE_ALLOC, frozenset({FLAG_FAIL})),
    "inval": (BASE_UNKNOWN, frozenset({FLAG_INVALID_REG})),
    "maint": (BASE_IDLE, frozenset({FLAG_MAINT})),
    "boot": (BASE_IDLE, frozenset({FLAG_REBOOT_REQUESTED})),
    "reboot": (BASE_IDLE, frozenset({FLAG_REBOOT_REQUESTED})),
    "reboot_requested": (BASE_IDLE, frozenset({FLAG_REBOOT_REQUESTED})),
    "reboot_issued": (BASE_IDLE, frozenset({FLAG_REBOOT_ISSUED})),
    "canc_r": (BASE_IDLE, frozenset()),
    "cancel_reboot": (BASE_IDLE, frozenset()),
    # A bare CLOUD state is a cloud node that has never registered: it is off.
    "cloud": (BASE_UNKNOWN, frozenset({FLAG_CLOUD, FLAG_POWERED_DOWN})),
    "pow_dn": (BASE_IDLE, frozenset({FLAG_POWER_DOWN})),
    "power_down": (BASE_IDLE, frozenset({FLAG_POWER_DOWN})),
    "pow_up": (BASE_IDLE, frozenset({FLAG_POWER_UP})),
    "power_up": (BASE_IDLE, frozenset({FLAG_POWER_UP})),
    "powring_dn": (BASE_IDLE, frozenset({FLAG_POWERING_DOWN})),
    "powering_down": (BASE_IDLE, frozenset({FLAG_POWERING_DOWN})),
    "powered_dn": (BASE_IDLE, frozenset({FLAG_POWERED_DOWN})),
    "powered_down": (BASE_IDLE, frozenset({FLAG_POWERED_DOWN})),
    "powering_up": (BASE_IDLE, frozenset({FLAG_POWERING_UP})),
    "npc": (BASE_IDLE, frozenset({FLAG_PERFCTRS})),
    "perfctrs": (BASE_IDLE, frozenset({FLAG_PERFCTRS})),
    "resv": (BASE_IDLE, frozenset({FLAG_RESERVED})),
    "reserved": (BASE_IDLE, frozenset({FLAG_RESERVED})),
    "plnd": (BASE_IDLE, frozenset({FLAG_PLANNED})),
    "planned": (BASE_IDLE, frozenset({FLAG_PLANNED})),
    "resm": (BASE_IDLE, frozenset()),
    "resume": (BASE_IDLE, frozenset()),
    "block": (BASE_ALLOC, frozenset({FLAG_BLOCKED})),
    "blocked": (BASE_ALLOC, frozenset({FLAG_BLOCKED})),
}


@dataclass(frozen=True)
class ParsedNodeState:
    """A node state string taken apart: one base word plus a set of flags."""

    raw: str
    base: str
    flags: frozenset[str]
    state: NodeState

    @property
    def powered_down(self) -> bool:
        return FLAG_POWERED_DOWN in self.flags

    @property
    def powering_up(self) -> bool:
        return bool({FLAG_POWERING_UP, FLAG_POWER_UP} & self.flags)

    @property
    def powering_down(self) -> bool:
        return bool({FLAG_POWERING_DOWN, FLAG_POWER_DOWN} & self.flags)

    @property
    def drain(self) -> bool:
        return FLAG_DRAIN in self.flags

    @property
    def not_responding(self) -> bool:
        return FLAG_NOT_RESPONDING in self.flags

    @property
    def held_out(self) -> bool:
        """Out of use by Slurm's own decision (down, drained, failed...). Not
        responding alone does not count: Slurm keeps such a node, and the jobs on
        it, until SlurmdTimeout."""
        return _decide(self.base, self.flags - {FLAG_NOT_RESPONDING}) is NodeState.DOWN


def _decide(base: str, flags: frozenset[str]) -> NodeState:
    """Order matters: an unusable node is DOWN whatever its power state; then power wins."""
    busy = base in (BASE_ALLOC, BASE_MIXED) or FLAG_COMPLETING in flags
    if base in (BASE_DOWN, BASE_ERROR, BASE_FUTURE) or flags & {FLAG_FAIL, FLAG_INVALID_REG}:
        return NodeState.DOWN if not (busy and FLAG_FAIL in flags) else NodeState.ALLOCATED
    if FLAG_DRAIN in flags and not busy:
        return NodeState.DOWN
    if FLAG_POWERED_DOWN in flags:
        # Slurm 24.11 and 26.05 keep POWERED_DOWN on a cloud node a job was just given,
        # until its resume starts (sinfo "mixed+cloud+powered_down"); 22.05 drops
        # the flag at allocation ("mixed+cloud"). Either way the node is taken, not free.
        return NodeState.ALLOCATED if busy else NodeState.POWERED_DOWN
    if flags & {FLAG_POWERING_UP, FLAG_POWER_UP, FLAG_REBOOT_ISSUED, FLAG_REBOOT_REQUESTED}:
        return NodeState.POWERING_UP if not busy else NodeState.ALLOCATED
    if flags & {FLAG_POWERING_DOWN, FLAG_POWER_DOWN}:
        return NodeState.POWERING_DOWN
    if FLAG_NOT_RESPONDING in flags:
        return NodeState.DOWN
    if FLAG_MAINT in flags and not busy:
        return NodeState.DOWN  # only the maintenance reservation may use it
    # Planned by backfill, perf counters, blocked: about to be used or unusable
    # by others; never "idle" in the sense of "free to release".
    if busy or flags & {FLAG_PLANNED, FLAG_PERFCTRS, FLAG_BLOCKED}:
        return NodeState.ALLOCATED
    if base == BASE_IDLE:
        return NodeState.IDLE
    return NodeState.UNKNOWN


def parse_node_state(raw: str) -> ParsedNodeState:
    """Take apart ``idle~``, ``IDLE~``, ``alloc+`` or ``IDLE+CLOUD+POWERED_DOWN``."""
    text = raw.strip()
    flags: set[str] = set()
    low = text.lower()
    if "+" in low.rstrip("+"):
        # Complete form: BASE+FLAG+FLAG (sinfo StateComplete, scontrol State=).
        parts = [p for p in low.split("+") if p]
        word, extra = parts[0], parts[1:]
        for flag in extra:
            name = flag.upper()
            if name not in KNOWN_NODE_FLAGS:
                log.warning("unknown Slurm node state flag %r in %r; ignoring it", name, raw)
            flags.add(name)
    else:
        word = low
        while word and word[-1] in NODE_SUFFIXES:
            flags.add(NODE_SUFFIXES[word[-1]])
            word = word[:-1]
    entry = NODE_WORDS.get(word)
    if entry is None:
        log.warning("unknown Slurm node state %r; treating the node as UNKNOWN", raw)
        return ParsedNodeState(raw, BASE_UNKNOWN, frozenset(flags), NodeState.UNKNOWN)
    base, implied = entry
    all_flags = frozenset(flags | implied)
    if base == BASE_UNKNOWN and not (all_flags & {FLAG_POWERED_DOWN, FLAG_INVALID_REG}):
        return ParsedNodeState(raw, base, all_flags, NodeState.UNKNOWN)
    return ParsedNodeState(raw, base, all_flags, _decide(base, all_flags))


def node_state(raw: str) -> NodeState:
    """Map one Slurm node state string; unknown -> UNKNOWN with a warning."""
    return parse_node_state(raw).state
