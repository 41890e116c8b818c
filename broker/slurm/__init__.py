"""gbroker's one door to Slurm: the backend contract and its implementations.

``make_backend()`` gives the backend to use here: pyslurm when it imports
and matches the running Slurm release, otherwise the command-line tools.

May import: the base modules (``errors``, ``states``, ``spec``, ``proc``, the
checkpoint manifest's constants) and ``policies``. Never the database, the
daemon's state or a domain: everything above reaches Slurm through this
package (principle 5).
"""

from __future__ import annotations

from broker.slurm.backend import Backend, NodeInfo, SacctRow, SlurmJob, SubmitRequest
from broker.slurm.runner import CallCounter, CompletedRun, Runner, run

BACKEND_NAMES = ("cli", "pyslurm")


def available_backends() -> list[str]:
    """Names of the backends that work on this machine (contract tests run each)."""
    from broker.slurm.pyslurm_backend import pyslurm_usable

    names = ["cli"]
    if pyslurm_usable():
        names.append("pyslurm")
    return names


def make_backend(prefer: str = "auto", *, runner: Runner | None = None, submit_with: str = "sbatch") -> Backend:
    """The backend named ``prefer`` ("cli", "pyslurm"), or the best one for "auto".

    ``submit_with``: "sbatch", "libslurm" or "auto" (see ``Settings.slurm_submit``)."""
    from broker.errors import ConfigError
    from broker.slurm.cli_backend import CliBackend

    if prefer not in ("auto", *BACKEND_NAMES):
        raise ConfigError(
            f"unknown Slurm backend {prefer!r}",
            hint=f"choose one of: auto, {', '.join(BACKEND_NAMES)}",
        )
    if prefer in ("auto", "pyslurm"):
        from broker.slurm.pyslurm_backend import PyslurmBackend, pyslurm_check

        usable, version = pyslurm_check(runner)
        if usable:
            return PyslurmBackend(runner, submit_with=submit_with, sinfo_version=version)
        if prefer == "pyslurm":
            raise ConfigError(
                "the pyslurm backend is not usable here",
                hint="install the pyslurm release that matches your Slurm, or use backend 'cli'",
            )
        return CliBackend(runner, submit_with=submit_with, sinfo_version=version)
    return CliBackend(runner, submit_with=submit_with)


__all__ = [
    "Backend",
    "CallCounter",
    "CompletedRun",
    "NodeInfo",
    "Runner",
    "SacctRow",
    "SlurmJob",
    "SubmitRequest",
    "available_backends",
    "make_backend",
    "run",
]
