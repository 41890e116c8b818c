"""A job's CPUs and memory reach Slurm, from #SBATCH lines and from flags; an unsupported line is refused.

On the real dev cluster (nodes of 4 CPUs and 4000 MB, untyped gpu:4): a job
that asks for nothing gets 1 CPU and the whole node's 4000M, so 2 CPUs and
1G in sacct can only come from what the job asked for.
"""

from __future__ import annotations

from typing import Any

import pytest

from broker_fixtures import broker_daemon, public_dir, user_dir  # noqa: F401  (fixture)

pytestmark = pytest.mark.slurm

ONE_GIB = {"1G", "1024M"}
"""How sacct may print 1 GiB of requested memory."""


def _allocation(cluster: Any, slurm_id: int) -> dict[str, str]:
    """The job's row in accounting, once slurmdbd has the whole record: a job that ends within
    moments can be listed before its request is (ReqCPUS 0, ReqMem unset, as "16?")."""
    def whole() -> dict[str, str] | None:
        rows = cluster.sacct_attempts(str(slurm_id), "JobID,State,ReqMem,ReqCPUS,AllocCPUS,ReqTRES")
        return rows[0] if len(rows) == 1 and rows[0]["ReqCPUS"] not in ("", "0") else None

    return cluster.wait_for(whole, 60, what=f"the accounting record of Slurm job {slurm_id}")


def test_script_lines_and_flags_reach_slurm_and_an_unsupported_line_is_refused(broker_daemon, slurm_cluster):
    d = broker_daemon
    base = user_dir(public_dir("gbroker-res-"), "alice")

    # Refused by name and line, before anything is stored.
    exclusive = base / "exclusive.sh"
    exclusive.write_text("#!/bin/bash\n#SBATCH --mem=1G\n#SBATCH --exclusive\nhostname\n")
    r = d.cli("submit", "--group", "vision", "--time", "5m", "--script", str(exclusive), cwd=base)
    assert r.code != 0
    assert "script: line 3: --exclusive ('#SBATCH --exclusive') is not supported" in r.err, r.err
    for listing in ("status", "history"):
        shown = d.cli(listing, "--json", cwd=base)
        assert shown.code == 0 and shown.json() == [], (listing, shown.out, shown.err)

    # #SBATCH lines in the script.
    script = base / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --mem=1G\n#SBATCH --cpus-per-task=2\nhostname\n")
    r = d.cli("submit", "--json", "--group", "vision", "--time", "5m", "--script", str(script), cwd=base)
    assert r.code == 0, r.err
    from_lines = r.json()["id"]

    # Flags: 512M and 1 CPU per GPU, two GPUs.
    r = d.cli("submit", "--json", "--group", "vision", "--time", "5m", "--gpus", "2", "--mem-per-gpu", "512M",
              "--cpus-per-gpu", "1", "--", "hostname", cwd=base)
    assert r.code == 0, r.err
    from_flags = r.json()["id"]

    done = {job_id: d.wait_job(job_id, lambda j: j["state"] == "completed", timeout=240)
            for job_id in (from_lines, from_flags)}

    row = _allocation(slurm_cluster, done[from_lines]["attempts"][-1]["slurm_job_id"])
    assert row["ReqMem"] in ONE_GIB, row
    assert (row["ReqCPUS"], row["AllocCPUS"]) == ("2", "2"), row

    row = _allocation(slurm_cluster, done[from_flags]["attempts"][-1]["slurm_job_id"])
    assert row["ReqMem"] in ONE_GIB, row  # 512M for each of 2 GPUs
    assert row["AllocCPUS"] == "2", row  # 1 for each of 2 GPUs
    assert "gres/gpu=2" in row["ReqTRES"], row
