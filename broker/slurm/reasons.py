"""Slurm's reason for a pending job, in words a researcher can act on.

squeue gives a pending job one reason code (``Priority``, ``Resources``,
``PartitionTimeLimit``, ``QOSMaxJobsPerUserLimit``, ...). ``gbroker status`` and
``show`` give it as a sentence that says what the job waits for and, where the
job will never start as it is, what to do; the code stays in parentheses
(``(Slurm: PartitionTimeLimit)``) so it can be looked up. A code not in the
table is shown as Slurm gives it.

Pure: the reconcile tick passes what it already read (the queue row, the
partition limits as last read), so the words cost no Slurm call.
"""

from __future__ import annotations

from broker.pools.limits import slurm_duration
from broker.slurm.partitions import PartitionInfo

REASONS: dict[str, str] = {
    "Priority": "waiting: jobs of higher priority are ahead of it in {partition}",
    "Resources": "waiting for free nodes or GPUs in {partition}",
    "ReqNodeNotAvail": "waiting: nodes it needs are down, drained, powering up or reserved",
    "NodeDown": "waiting: a node it needs is down",
    "PartitionTimeLimit": "waiting: the job's time limit{asked} is above partition {partition}'s MaxTime{max_time}; "
                          "it will not start there: cancel it and submit with a shorter --time",
    "PartitionNodeLimit": "waiting: the job's node count is outside partition {partition}'s MinNodes..MaxNodes{nodes}; "
                          "it will not start there: cancel it and submit with fewer --nodes",
    "PartitionDown": "waiting: partition {partition} is down in Slurm (an admin's doing)",
    "PartitionInactive": "waiting: partition {partition} is inactive in Slurm (an admin's doing)",
    "PartitionConfig": "waiting: the job asks for more than partition {partition} is configured with",
    "AssocGrpGRES": "waiting: the group (Slurm account) uses all the GPUs its limit allows (GrpTRES)",
    "AssocGrpGRESMinutes": "waiting: the group (Slurm account) used up its GPU-minutes (GrpTRESMins)",
    "AssocGrpCpuLimit": "waiting: the group (Slurm account) uses all the CPUs its limit allows (GrpTRES)",
    "AssocGrpNodeLimit": "waiting: the group (Slurm account) uses all the nodes its limit allows (GrpTRES)",
    "AssocGrpJobsLimit": "waiting: the group (Slurm account) runs as many jobs as its limit allows (GrpJobs)",
    "AssocMaxJobsLimit": "waiting: you run as many jobs in this group as your limit allows (MaxJobs)",
    "AssocGrpSubmitJobsLimit": "waiting: the group (Slurm account) has as many jobs queued as its limit allows",
    "AssocMaxWallDurationPerJobLimit": "waiting: the job's time limit is above the group's MaxWall; "
                                       "it will not start: submit with a shorter --time",
    "QOSMaxJobsPerUserLimit": "waiting: you run as many jobs as the QOS allows per user (MaxJobsPerUser)",
    "QOSMaxGRESPerUser": "waiting: you use as many GPUs as the QOS allows per user (MaxTRESPerUser)",
    "QOSMaxCpuPerUserLimit": "waiting: you use as many CPUs as the QOS allows per user (MaxTRESPerUser)",
    "QOSMaxNodePerUserLimit": "waiting: you use as many nodes as the QOS allows per user (MaxTRESPerUser)",
    "QOSMaxSubmitJobPerUserLimit": "waiting: you have as many jobs queued as the QOS allows per user",
    "QOSGrpGRES": "waiting: the QOS's jobs use all the GPUs it allows (GrpTRES)",
    "QOSGrpCpuLimit": "waiting: the QOS's jobs use all the CPUs it allows (GrpTRES)",
    "QOSGrpNodeLimit": "waiting: the QOS's jobs use all the nodes it allows (GrpTRES)",
    "QOSMaxWallDurationPerJobLimit": "waiting: the job's time limit is above the QOS's MaxWall; "
                                     "it will not start: submit with a shorter --time",
    "QOSMaxGRESPerJob": "waiting: the job asks for more GPUs than the QOS allows per job (MaxTRESPerJob); "
                        "it will not start: ask for fewer",
    "QOSMaxNodePerJobLimit": "waiting: the job asks for more nodes than the QOS allows per job; "
                             "it will not start: ask for fewer",
    "JobHeldUser": "held in Slurm by its owner (`scontrol release {job}` lets it start)",
    "JobHeldAdmin": "held in Slurm by an admin",
    "BeginTime": "waiting for its begin time (after a requeue, Slurm's delay; gbroker clears it)",
    "Dependency": "waiting for the jobs it depends on",
    "DependencyNeverSatisfied": "will never start: a job it depends on did not end as it needs",
    "Reservation": "waiting for its reservation to start",
    "Licenses": "waiting for licenses",
    "BadConstraints": "waiting: no node has the features it asks for",
    "Cleaning": "waiting: its last run is still being cleaned up on its nodes",
    "InvalidAccount": "will not start: its group is not a Slurm account it may use",
    "InvalidQOS": "will not start: its QOS is not one it may use",
    "AccountNotAllowed": "will not start: partition {partition} does not allow its group",
}
"""Slurm's reason codes (``squeue %r``) and their words; ``{partition}``, ``{job}`` and the
limits are filled in from the queue row and the partition's limits as last read."""


def pending_in_words(raw: str, *, partition: str, job_id: int, time_limit_s: int | None,
                     limits: PartitionInfo | None = None) -> str:
    """``raw`` (a pending job's Slurm reason) as a sentence ending ``(Slurm: RAW)``;
    '' for none, and an unknown code as it is."""
    raw = raw.strip()
    if not raw:
        return ""
    code = raw.split(",", 1)[0].strip()  # "ReqNodeNotAvail, UnavailableNodes:od1"
    words = REASONS.get(code)
    if words is None:
        return raw
    fields = {
        "partition": partition or "its partition",
        "job": job_id,
        "asked": f" ({slurm_duration(time_limit_s)})" if time_limit_s else "",
        "max_time": f" ({slurm_duration(limits.max_time_s)})" if limits and limits.max_time_s is not None else "",
        "nodes": f" ({limits.min_nodes}..{limits.max_nodes if limits.max_nodes is not None else 'unlimited'})"
        if limits else "",
    }
    return f"{words.format(**fields)} (Slurm: {raw})"

