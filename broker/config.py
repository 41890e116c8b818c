"""One typed settings object, resolved once: defaults < file < environment < flags.

The file is TOML (``/etc/gbroker/gbroker.toml`` or ``$GBROKER_CONFIG``)::

    db_url = "sqlite:////var/lib/gbroker/gbroker.db"
    socket = "/run/gbroker/gbroker.sock"
    policy = "gbroker"
    tick_seconds = 15
    admin_group = "gbroker-admin"

    [partitions]            # capacity type -> Slurm partition
    spot = "spot"
    ondemand = "ondemand"

This module imports only the standard library: the CLI loads it on every call.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

from broker.errors import ConfigError

DEFAULT_CONFIG_PATH = Path("/etc/gbroker/gbroker.toml")


def default_socket_path() -> str:
    if os.geteuid() == 0:
        return "/run/gbroker/gbroker.sock"
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/gbroker-{os.geteuid()}"
    return str(Path(runtime) / "gbroker.sock")


def default_db_url() -> str:
    # Mirrors broker.db.engine.default_db_url without importing SQLAlchemy: the CLI loads this module.
    if os.geteuid() == 0:
        return "sqlite:////var/lib/gbroker/gbroker.db"
    state = os.environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(state):  # the XDG spec says a relative value is to be ignored
        state = str(Path.home() / ".local" / "state")
    return f"sqlite:///{Path(state) / 'gbroker' / 'gbroker.db'}"


@dataclass(frozen=True)
class Settings:
    db_url: str = field(default_factory=default_db_url)
    socket: str = field(default_factory=default_socket_path)
    policy: str = "simple"
    """Placement policy name (``gbroker simulate --help`` lists them)."""
    tick_seconds: float = 15.0
    """How often the daemon reconciles with Slurm."""
    max_spot_reclaims: int = 3
    """Reclaims after which a job moves to on-demand (policies that use it)."""
    admin_group: str = "gbroker-admin"
    """Unix group whose members may run admin commands."""
    spot_partition: str = "spot"
    ondemand_partition: str = "ondemand"
    slurm_backend: str = "auto"
    """'auto' (pyslurm when usable, else the command-line tools), 'cli' or 'pyslurm'."""
    slurm_timeout_seconds: float = 30.0
    backoff_max_seconds: float = 300.0
    """Longest pause between reconcile tries while the Slurm controller is down."""
    lease_ttl_seconds: float = 60.0
    """A daemon that stops renewing its lease for this long is presumed dead."""
    max_gpus_per_node: int = 8
    max_nodes: int = 16

    def partition_for(self, capacity: str) -> str:
        return self.spot_partition if capacity == "spot" else self.ondemand_partition

    @property
    def partitions(self) -> set[str]:
        return {self.spot_partition, self.ondemand_partition}


_ENV = {
    "GBROKER_DB_URL": "db_url",
    "GBROKER_SOCKET": "socket",
    "GBROKER_POLICY": "policy",
    "GBROKER_TICK_SECONDS": "tick_seconds",
    "GBROKER_MAX_SPOT_RECLAIMS": "max_spot_reclaims",
    "GBROKER_ADMIN_GROUP": "admin_group",
    "GBROKER_SLURM_BACKEND": "slurm_backend",
}


def _coerce(name: str, value: Any, source: str) -> Any:
    kinds = {f.name: f.type for f in fields(Settings)}
    kind = kinds[name]
    try:
        if kind == "float":
            return float(value)
        if kind == "int":
            if isinstance(value, bool):
                raise ValueError
            return int(value)
        if not isinstance(value, str):
            raise ValueError
        return value
    except (TypeError, ValueError):
        raise ConfigError(
            f"{source}: {name} = {value!r} is not a valid {kind}",
            hint=f"fix {name} in {source}",
        ) from None


def _from_mapping(data: Mapping[str, Any], source: str) -> dict[str, Any]:
    known = {f.name for f in fields(Settings)}
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key == "partitions":
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: [partitions] must be a table")
            for cap, part in value.items():
                if cap not in ("spot", "ondemand"):
                    raise ConfigError(
                        f"{source}: unknown capacity {cap!r} in [partitions]",
                        hint="use the keys spot and ondemand",
                    )
                out[f"{cap}_partition"] = _coerce(f"{cap}_partition", part, source)
            continue
        if key not in known:
            raise ConfigError(
                f"{source}: unknown setting {key!r}",
                hint="known settings: " + ", ".join(sorted(known)),
            )
        out[key] = _coerce(key, value, source)
    return out


def load_settings(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Resolve the settings once: defaults < file < environment < flags."""
    env = os.environ if env is None else env
    settings = Settings()
    file_path = Path(path) if path else Path(env.get("GBROKER_CONFIG", DEFAULT_CONFIG_PATH))
    if file_path.exists():
        try:
            data = tomllib.loads(file_path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read {file_path}: {exc}", hint="fix the file") from None
        settings = replace(settings, **_from_mapping(data, str(file_path)))
    elif path:
        raise ConfigError(f"config file {file_path} does not exist")
    from_env = {attr: env[var] for var, attr in _ENV.items() if env.get(var)}
    settings = replace(settings, **_from_mapping(from_env, "environment"))
    if overrides:
        clean = {k: v for k, v in overrides.items() if v is not None}
        settings = replace(settings, **_from_mapping(clean, "command line"))
    return settings
