"""Record what the real Slurm commands print, for the parser unit tests.

Runs the exact commands the CLI backend runs (same argv, same environment)
and saves stdout under this directory as ``<name>.<command>.txt``, plus the
argv in ``<name>.<command>.argv``. Re-run it against another Slurm release
(e.g. 24.11) to refresh the recordings::

    SLURM_CONF=... PYTHONPATH=. python tests/unit/data/slurm/record.py NAME [squeue sacct sinfo]
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

from broker.slurm.cli_backend import CliBackend
from broker.slurm.runner import CompletedRun, Runner

HERE = Path(__file__).resolve().parent


class RecordingRunner(Runner):
    """A Runner that also writes each command's stdout to a file."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def run(
        self,
        argv: list[str],
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        input: str | None = None,
    ) -> CompletedRun:
        result = super().run(argv, timeout_s=timeout_s, env=env, user=user, input=input)
        stem = f"{self.name}.{Path(argv[0]).name}"
        (HERE / f"{stem}.txt").write_text(result.stdout)
        (HERE / f"{stem}.argv").write_text("\n".join(argv) + "\n")
        return result


def main(args: list[str]) -> None:
    name, *what = args
    backend = CliBackend(RecordingRunner(name))
    what = what or ["squeue", "sacct", "sinfo"]
    if "squeue" in what:
        backend.jobs()
    if "sacct" in what:
        backend.history(since=datetime.now(UTC) - timedelta(days=1))
    if "sinfo" in what:
        backend.nodes()


if __name__ == "__main__":
    main(sys.argv[1:])
