"""Malformed and hostile submissions, through the real CLI and daemon, as a real user.

Each is refused with a message naming what is wrong; afterwards neither the
database nor Slurm holds anything from them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from broker_fixtures import broker_daemon, public_dir, user_dir  # noqa: F401  (fixture)

pytestmark = pytest.mark.slurm

OK_CMD = ["--", "sleep", "1"]
BASE = ["--group", "vision", "--time", "10m"]

# (case id, job file text or None, extra CLI args, fragment the error must contain)
CASES: list[tuple[str, str | None, list[str], str]] = [
    ("unknown-kind", None, [*BASE, "--kind", "painting", *OK_CMD], "painting"),
    ("zero-gpus", None, [*BASE, "--gpus", "0", *OK_CMD], "gpus_per_node"),
    ("negative-gpus", None, [*BASE, "--gpus", "-2", *OK_CMD], "gpus_per_node"),
    ("impossible-gpus", None, [*BASE, "--gpus", "1000", *OK_CMD], "gpus_per_node"),
    ("zero-nodes", None, [*BASE, "--nodes", "0", *OK_CMD], "nodes"),
    ("too-many-nodes", None, [*BASE, "--nodes", "5000", *OK_CMD], "nodes"),
    ("bad-duration", None, ["--group", "vision", "--time", "soon", *OK_CMD], "time_limit"),
    ("negative-duration", None, ["--group", "vision", "--time", "-5m", *OK_CMD], "time_limit"),
    ("deadline-past", None, [*BASE, "--deadline", "2001-01-01T00:00:00+00:00", *OK_CMD], "deadline"),
    ("deadline-before-limit", None, ["--group", "vision", "--time", "4h", "--deadline", "+1h", *OK_CMD], "deadline"),
    ("deadline-garbage", None, [*BASE, "--deadline", "tomorrow-ish", *OK_CMD], "deadline"),
    ("name-newline", None, [*BASE, "--name", "a\nb", *OK_CMD], "name"),
    ("name-semicolon", None, [*BASE, "--name", "x;rm -rf /", *OK_CMD], "name"),
    ("name-subshell", None, [*BASE, "--name", "$(whoami)", *OK_CMD], "name"),
    ("group-backtick", None, ["--group", "vis`id`", "--time", "10m", *OK_CMD], "group"),
    ("group-missing", None, ["--time", "10m", *OK_CMD], "group"),
    ("command-newline", None, [*BASE, "--", "echo", "a\nb"], "command"),
    ("no-command", None, [*BASE], "command"),
    ("unknown-partition", None, [*BASE, "--partition", "gpu-huge", *OK_CMD], "partition"),
    ("env-bad-name", None, [*BASE, "--env", "A B=1", *OK_CMD], "env"),
    ("env-slurm-override", None, [*BASE, "--env", "SBATCH_ACCOUNT=climate", *OK_CMD], "env"),
    ("typo-key", 'group = "vision"\ngpu_per_node = 2\ncommand = ["true"]\n', [], "gpus_per_node"),
    ("wrong-type", 'group = "vision"\ngpus_per_node = "two"\ncommand = ["true"]\n', [], "gpus_per_node"),
    ("bad-toml", 'group = "vision\ncommand = [\n', [], "line"),
    ("bad-style", 'group = "vision"\ncommand = ["true"]\n[checkpoint]\nstyle = "sometimes"\n', [], "style"),
    ("sbatch-partition", 'group = "vision"\nscript = "#!/bin/bash\\n#SBATCH --partition=ondemand\\nhostname\\n"\n', [], "partition"),
    ("sbatch-account", 'group = "vision"\nscript = "#!/bin/bash\\n#SBATCH -A climate\\nhostname\\n"\n', [], "account"),
    ("sbatch-uid", 'group = "vision"\nscript = "#!/bin/bash\\n#SBATCH --uid=0\\nhostname\\n"\n', [], "uid"),
    ("not-a-table", "= 3\n", [], "line"),
    # Refused by Slurm itself: alice is not in the climate account, and no such account exists.
    ("foreign-account", None, ["--group", "climate", "--time", "10m", *OK_CMD], "account"),
    ("unknown-account", None, ["--group", "physics", "--time", "10m", *OK_CMD], "account"),
]


def test_at_least_twenty_cases() -> None:
    assert len(CASES) >= 20


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_submit_is_refused_and_leaves_nothing(case, broker_daemon, slurm_cluster) -> None:
    d = broker_daemon
    _, job_file, args, fragment = case
    work = user_dir(public_dir("gbroker-hostile-"), "alice")
    argv = ["submit"]
    if job_file is not None:
        f = Path(work) / "job.toml"
        f.write_text(job_file)
        argv.append(str(f))
    r = d.cli(*argv, *args, cwd=work)
    assert r.code != 0, f"accepted: {r.out}"
    assert "Traceback" not in r.err, r.err
    assert fragment.lower() in r.err.lower(), r.err
    assert r.err.startswith("gbroker: error:") or "Error:" in r.err, r.err
    history = d.cli("history", "--json")
    assert history.code == 0 and history.json() == [], history.out
    queue = subprocess.run(
        ["squeue", "-h", "-u", "alice", "-o", "%j"], env=slurm_cluster.env, capture_output=True, text=True, check=True
    )
    assert [n for n in queue.stdout.split() if n.startswith("gb-")] == []
