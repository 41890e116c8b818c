"""Record what the real Slurm commands print, for the parser unit tests.

Runs the exact commands the CLI backend runs (same argv, same environment)
and saves stdout under this directory as ``<name>.<command>.txt``, plus the
argv in ``<name>.<command>.argv``. Re-run it against another Slurm release
(e.g. 24.11) to refresh the recordings::

    SLURM_CONF=... PYTHONPATH=. python tests/unit/data/slurm/record.py [--out DIR] NAME [squeue sacct sinfo]

``--out DIR`` writes there instead (another release's set, e.g. ``24.11/``);
the commands come from ``GBROKER_SLURM_BIN_DIR`` when set (another release's
dev cluster: ``contrib/slurm/devcluster env`` prints it), as gbroker's own.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

from broker.slurm import parse
from broker.slurm.cli_backend import CliBackend
from broker.slurm.runner import DEFAULT_BIN_DIR, CompletedRun, Runner

HERE = Path(__file__).resolve().parent


class RecordingRunner(Runner):
    """A Runner that also writes each command's stdout to a file."""

    def __init__(self, name: str, out: Path = HERE) -> None:
        super().__init__(bin_dir=os.environ.get("GBROKER_SLURM_BIN_DIR") or DEFAULT_BIN_DIR)
        self.name = name
        self.out = out

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
        self.out.mkdir(parents=True, exist_ok=True)
        # Kept with the bare separators (each command draws its own token), squeue's format
        # on the command line: the replays answer with the separators the backend asks for.
        sep = parse.separators_of(argv, env)
        (self.out / f"{stem}.txt").write_text(plain(result.stdout, sep))
        recorded = [plain(a, sep) for a in argv]
        if env and parse.SQUEUE_FORMAT_ENV in env:
            recorded.append("--Format=" + plain(env[parse.SQUEUE_FORMAT_ENV], sep))
        (self.out / f"{stem}.argv").write_text("\n".join(recorded) + "\n")
        return result


def plain(text: str, sep: parse.Separators) -> str:
    return text.replace(sep.fs, parse.FS).replace(sep.rs, parse.RS)


def main(args: list[str]) -> None:
    out = HERE
    if args[:1] == ["--out"]:
        out, args = Path(args[1]).resolve(), args[2:]
    name, *what = args
    backend = CliBackend(RecordingRunner(name, out))
    what = what or ["squeue", "sacct", "sinfo"]
    if "squeue" in what:
        backend.jobs()
    if "sacct" in what:
        backend.history(since=datetime.now(UTC) - timedelta(days=1))
    if "sinfo" in what:
        backend.nodes()


if __name__ == "__main__":
    main(sys.argv[1:])
