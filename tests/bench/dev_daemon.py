"""What the benchmarks that talk to a real daemon share: the dev cluster, a scratch directory, the env.

Imported by bench_broker.py and bench_load.py (run as scripts from this directory).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEVCLUSTER = REPO / "contrib" / "slurm" / "devcluster"


def dev_cluster_conf() -> str:
    """Bring the dev cluster up if it is not, and return its SLURM_CONF."""
    if subprocess.run([str(DEVCLUSTER), "status"], capture_output=True).returncode != 0:
        subprocess.run([str(DEVCLUSTER), "up"], check=True)
    conf = subprocess.run([str(DEVCLUSTER), "env"], capture_output=True, text=True, check=True).stdout
    return conf.strip().split("=", 1)[1].strip("'\"")


def daemon_env(prefix: str, slurm_conf: str) -> tuple[Path, dict[str, str]]:
    """A world-readable scratch directory with an empty settings file and a SQLite database, and the
    environment a daemon and its clients run with there (with compiled modules: a
    PYTHONDONTWRITEBYTECODE environment would compile every module of every run)."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(work, 0o755)
    (work / "g.toml").write_text("")
    env = dict(os.environ, SLURM_CONF=slurm_conf, PYTHONPATH=str(REPO),
               GBROKER_DB_URL=f"sqlite:///{work}/db.sqlite", GBROKER_CONFIG=str(work / "g.toml"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return work, env
