"""One root error for everything a user can see.

Every error carries a message that says what went wrong *and* what to do
about it; the CLI prints ``str(err)`` and exits with ``err.exit_code``.
"""

from __future__ import annotations


class BrokerError(Exception):
    """Root of every gbroker error a user can see."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if not hint else f"{message}\n  hint: {hint}")

    def to_dict(self) -> dict[str, str]:
        return {"error": type(self).__name__, "message": self.message, "hint": self.hint or ""}


class SpecError(BrokerError):
    """A job file or submit flags are invalid. Nothing was created."""

    exit_code = 2


class ConfigError(BrokerError):
    """The configuration file or environment is invalid."""

    exit_code = 2


class NotFound(BrokerError):
    """A job, group or semester that does not exist (or is not yours)."""

    exit_code = 3


class PermissionDenied(BrokerError):
    """The caller (as reported by the kernel) may not do this."""

    exit_code = 4


class AdmissionRefused(BrokerError):
    """Quota or budget would be broken; the job was not admitted."""

    exit_code = 5


class DaemonUnavailable(BrokerError):
    """The CLI could not reach the daemon."""

    exit_code = 6


class SlurmError(BrokerError):
    """A Slurm command failed; carries argv, exit code and stderr."""

    exit_code = 7

    def __init__(
        self,
        message: str,
        *,
        argv: list[str] | None = None,
        returncode: int | None = None,
        stderr: str = "",
        hint: str | None = None,
    ) -> None:
        self.argv = list(argv or [])
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(message, hint=hint)


class SlurmUnavailable(SlurmError):
    """The Slurm controller did not answer (down, or timed out).

    Jobs are *unknown* while this holds, never failed.
    """
