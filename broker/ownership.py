"""Which Slurm job ids are really a gbroker job's: the check before root touches one.

The daemon runs scancel and scontrol as root, and root may cancel, hold or
requeue anyone's job. So an id gbroker recorded is acted on only when Slurm
itself shows it as that job's: submitted by the job's owner and carrying the
job's key (in its comment, or in its name ``<key>-<attempt>``). A recorded id
that fails the check is never touched, whatever put it there.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from broker.state import Services

log = logging.getLogger(__name__)


def is_ours(key: str, owner: str, *, name: str, comment: str, user: str) -> bool:
    """True when a Slurm job (or accounting row) with these fields is the gbroker job ``key`` of ``owner``."""
    return user == owner and (comment == key or name.startswith(key + "-"))


def verified(svc: Services, bound: Iterable[tuple[int, str, str]]) -> list[int]:
    """The ids among (slurm id, key, owner) that Slurm shows as theirs now; one squeue call.

    Ids that are no longer in the queue are left out (nothing to act on);
    ids that belong to someone else are left out and logged.
    """
    wanted = {sid: (key, owner) for sid, key, owner in bound}
    if not wanted:
        return []
    out, bad = set(), set()
    for sj in svc.backend.jobs(job_ids=list(wanted)):
        # A Slurm array id lists its tasks, each under its own id: the array is the id asked about.
        sid = sj.job_id if sj.job_id in wanted else sj.array_job_id
        if sid is None or sid not in wanted:
            continue
        key, owner = wanted[sid]
        if is_ours(key, owner, name=sj.name, comment=sj.comment, user=sj.user):
            out.add(sid)
        else:
            bad.add(sid)
            log.error("Slurm job %s is recorded for gbroker job %s of %s but Slurm shows it as %s's "
                      "(name %r); not touching it", sj.job_id, key, owner, sj.user, sj.name)
    return sorted(out - bad)
