"""Admission at submit: quota and budget checks, and the money reserved for the job.

Called inside the submit transaction, under the daemon's write lock, so the
check and the reservation are one step: twenty submissions at once cannot
overspend. This first version admits everything and reserves nothing; the
budget module replaces it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from broker.api import Caller
from broker.spec import JobSpec


@dataclass(frozen=True)
class Admission:
    estimate_micros: int = 0
    """The policy's cost estimate for the job on the capacity it was placed on."""
    reserved_micros: int = 0
    """Money held against the group's budget until the job's charges land."""
    note: str = ""


def admit(
    session: Session,
    svc: object,
    caller: Caller,
    spec: JobSpec,
    capacity: str,
    partition: str,
    now: datetime,
) -> Admission:
    """Raise AdmissionRefused (with the numbers) or return what to reserve."""
    return Admission()
