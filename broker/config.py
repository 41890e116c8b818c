"""One typed settings object, resolved once: defaults < file < environment < flags.

The file is TOML (``/etc/gbroker/gbroker.toml`` or ``$GBROKER_CONFIG``)::

    db_url = "sqlite:////var/lib/gbroker/gbroker.db"
    socket = "/run/gbroker/gbroker.sock"
    policy = "gbroker"
    tick_seconds = 15
    admin_group = "gbroker-admin"
    node_idle_seconds = 600  # node manager (docs/NODES.md)
    node_provider = "aws"

    [partitions]            # capacity type -> Slurm partition (two pools)
    spot = "spot"
    ondemand = "ondemand"

    [nodes.spot]            # per managed partition; all keys optional
    idle_seconds = 300
    warm_min = 1
    price_per_node_hour = "2.40"
    capacity = "spot"
    instance_type = "g5.xlarge"

    [providers.aws]         # keyword arguments of the provider (docs/PROVIDERS.md)
    region = "eu-west-1"
    cluster_name = "lab"

or, instead of ``[partitions]`` and ``[nodes.*]``, the pool catalog (docs/POOLS.md)::

    [pools.a100-spot]
    partition = "spot"
    capacity = "spot"
    gpu_type = "a100"
    gpu_mem_gb = 80

This module imports only the standard library: the CLI loads it on every call.
"""

from __future__ import annotations

import json
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from broker.errors import ConfigError
from broker.opsconfig import MetricsSettings, NotifySettings, WebSettings, parse_metrics, parse_notify, parse_web
from broker.pools.catalog import CLASSES, Billing, Catalog, Pool, check_unique, legacy_pools, parse_pools
from broker.pools.catalog import NAME_RE as POOL_NAME_RE

DEFAULT_CONFIG_PATH = Path("/etc/gbroker/gbroker.toml")


SYSTEM_SOCKET = "/run/gbroker/gbroker.sock"


def default_socket_path() -> str:
    # Users talk to the lab's (root) daemon when there is one; otherwise to their own.
    if os.geteuid() == 0 or os.path.exists(SYSTEM_SOCKET):
        return SYSTEM_SOCKET
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/gbroker-{os.geteuid()}"
    return str(Path(runtime) / "gbroker.sock")


def default_node_journal() -> str:
    """Where `gbroker node resume|suspend` records what it did while the daemon was down."""
    if os.geteuid() == 0:
        return "/var/lib/gbroker/node-journal.jsonl"
    state = os.environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(state):
        state = str(Path.home() / ".local" / "state")
    return str(Path(state) / "gbroker" / "node-journal.jsonl")


NODE_PARTITION_KEYS = ("idle_seconds", "warm_min", "price_per_node_hour", "capacity", "instance_type")


@dataclass(frozen=True)
class NodePartition:
    """How the node manager treats the nodes of one Slurm partition (``[nodes.<name>]``)."""

    name: str
    idle_seconds: float | None = None
    """None: ``node_idle_seconds``."""
    warm_min: int = 0
    """Nodes kept powered up even when idle (and powered up to reach it)."""
    price_per_node_hour: str | None = None
    """Exact decimal string; None: the price book's GPU-hour price times the node's GPUs."""
    capacity: str | None = None
    """'spot' or 'ondemand'; None: from ``[partitions]`` (else on-demand)."""
    instance_type: str | None = None
    """None: the provider's default for the partition."""
    power_down: bool = True
    """False: never released (owned and reserved pools, unless they say otherwise)."""
    billing: Billing = Billing()
    """How the partition's nodes are billed (per second unless its pool says otherwise)."""


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
    policy: str = "gbroker"
    """Placement policy name (``gbroker daemon --help`` lists them)."""
    tick_seconds: float = 15.0
    """How often the daemon reconciles with Slurm."""
    max_spot_reclaims: int = 3
    """Reclaims after which a job moves to on-demand (policies that use it)."""
    admin_group: str = "gbroker-admin"
    """Unix group whose members may run admin commands."""
    hook_user: str = "nobody"
    """Unix user that budget alert commands run as. Admins set those commands over the
    socket, so they never run as root unless root names root here, in the config file."""
    spot_partition: str = "spot"
    ondemand_partition: str = "ondemand"
    slurm_backend: str = "auto"
    """'auto' (pyslurm when usable, else the command-line tools), 'cli' or 'pyslurm'."""
    slurm_submit: str = "auto"
    """How the daemon queues jobs: 'auto' (libslurm in the daemon when its module is built
    for the running Slurm, ``python -m broker.slurm.native_build``; else sbatch as the
    user), 'sbatch' or 'libslurm' (refused at start when not available)."""
    slurm_bin_dir: str = "/usr/bin"
    """Where Slurm's commands (sbatch, squeue, scontrol...) are. gbroker runs them by
    absolute path from here, never through anyone's PATH."""
    slurm_timeout_seconds: float = 30.0
    backoff_max_seconds: float = 300.0
    """Longest pause between reconcile tries while the Slurm controller is down."""
    lease_ttl_seconds: float = 60.0
    """A daemon that stops renewing its lease for this long is presumed dead."""
    max_gpus_per_node: int = 8
    max_nodes: int = 16
    node_idle_seconds: float = 600.0
    """A powered-up node idle this long is released (per partition: ``[nodes.<p>] idle_seconds``)."""
    node_tick_seconds: float = 30.0
    """How often the node manager looks at the nodes (release, sweep, interruptions)."""
    node_provider: str = ""
    """Provider behind ResumeProgram/SuspendProgram ('local', 'aws', 'command'); '' = none:
    idle nodes are still released through Slurm, but there is no sweep and no hook target."""
    node_sweep_grace_seconds: float = 900.0
    """An instance younger than this is never swept (keep it above Slurm's ResumeTimeout)."""
    node_journal: str = field(default_factory=default_node_journal)
    """File the node hooks append to when the daemon is down; the daemon ingests it."""
    node_partitions: tuple[NodePartition, ...] = ()
    """``[nodes.<partition>]`` tables; empty: the spot and on-demand partitions, defaults only."""
    node_provider_settings: str = "{}"
    """JSON of the ``[providers.<name>]`` tables (kept as text so Settings stays hashable)."""
    pools: tuple[Pool, ...] = ()
    """``[pools.<name>]`` tables; empty: the two pools of ``[partitions]`` (``legacy_pools``)."""
    timezone: str = "UTC"
    """The lab's IANA time zone: a written date (a semester's first and last day) is local midnight."""
    currency: str = "USD"
    """ISO 4217 code of the lab's money (metrics labels, notifications, ``config check``)."""
    metrics: MetricsSettings = MetricsSettings()
    """``[metrics]``: the opt-in TCP listener (/metrics, /healthz, /readyz; docs/OPERATIONS.md)."""
    notify: NotifySettings = NotifySettings()
    web: WebSettings = WebSettings()
    """``[web]``: the dashboard on the metrics listener (trust a reverse proxy's user header)."""
    """``[notify]``: notification targets and subscriptions, delivered through the outbox."""

    def zone(self) -> Any:
        """The lab's time zone as a ``tzinfo``."""
        from zoneinfo import ZoneInfo

        return ZoneInfo(self.timezone)

    def catalog(self) -> Catalog:
        """The pool catalog: the one partition -> pool map."""
        return Catalog(self.pools or legacy_pools(self.spot_partition, self.ondemand_partition))

    def pool_of(self, partition: str) -> Pool | None:
        return self.catalog().by_partition(partition)

    def capacity_of(self, partition: str) -> str | None:
        """The capacity class of ``partition``: the one partition -> capacity map.

        The pool catalog first (its pool's class: owned, reserved, spot or
        on-demand), then the ``capacity`` of the partition's
        ``[nodes.<partition>]`` table; None for a partition gbroker knows no
        capacity of. ``load_settings`` refuses a ``[nodes.<p>]`` capacity that
        contradicts the catalog.
        """
        pool = self.pool_of(partition)
        if pool is not None:
            return pool.capacity
        rule = {p.name: p for p in self.node_partitions}.get(partition)
        return rule.capacity if rule is not None else None

    def partition_for(self, capacity: str) -> str:
        """The partition of the first pool of ``capacity`` (with two pools: the ``[partitions]`` table)."""
        for pool in self.catalog().pools:
            if pool.capacity == capacity:
                return pool.partition
        return self.spot_partition if capacity == "spot" else self.ondemand_partition

    @property
    def partitions(self) -> set[str]:
        return set(self.catalog().partitions)

    def managed_node_partitions(self) -> dict[str, NodePartition]:
        """Partitions whose nodes the node manager tracks and releases, by name.

        With a pool catalog, one per pool (its idle time, warm minimum, node
        price, class, power-down and billing) plus any ``[nodes.<p>]`` of a
        partition outside the catalog.
        """
        if self.pools:
            out = {p.partition: NodePartition(
                p.partition, p.idle_seconds, p.warm_min, p.price_per_node_hour, p.capacity, p.instance_type,
                p.power_down, p.billing) for p in self.pools}
            out.update({p.name: p for p in self.node_partitions if p.name not in out})
            return out
        if self.node_partitions:
            return {p.name: p for p in self.node_partitions}
        return {name: NodePartition(name) for name in sorted(self.partitions)}

    def node_capacity(self, partition: str) -> str:
        """The capacity class of a managed partition's nodes: ``capacity_of``, else on-demand."""
        return self.capacity_of(partition) or "ondemand"

    def node_idle_seconds_for(self, partition: str) -> float:
        rule = self.managed_node_partitions().get(partition)
        if rule is not None and rule.idle_seconds is not None:
            return rule.idle_seconds
        return self.node_idle_seconds

    def provider_settings(self, name: str | None = None) -> dict[str, Any]:
        """The ``[providers.<name>]`` table (a fresh dict each call)."""
        table = json.loads(self.node_provider_settings).get(name or self.node_provider, {})
        return dict(table)


_ENV = {
    "GBROKER_DB_URL": "db_url",
    "GBROKER_SOCKET": "socket",
    "GBROKER_POLICY": "policy",
    "GBROKER_TICK_SECONDS": "tick_seconds",
    "GBROKER_MAX_SPOT_RECLAIMS": "max_spot_reclaims",
    "GBROKER_ADMIN_GROUP": "admin_group",
    "GBROKER_SLURM_BACKEND": "slurm_backend",
    "GBROKER_SLURM_SUBMIT": "slurm_submit",
    "GBROKER_SLURM_BIN_DIR": "slurm_bin_dir",
    "GBROKER_NODE_IDLE_SECONDS": "node_idle_seconds",
    "GBROKER_NODE_TICK_SECONDS": "node_tick_seconds",
    "GBROKER_NODE_PROVIDER": "node_provider",
    "GBROKER_NODE_SWEEP_GRACE_SECONDS": "node_sweep_grace_seconds",
    "GBROKER_NODE_JOURNAL": "node_journal",
    "GBROKER_TIMEZONE": "timezone",
    "GBROKER_CURRENCY": "currency",
    "GBROKER_MAX_NODES": "max_nodes",
    "GBROKER_MAX_GPUS_PER_NODE": "max_gpus_per_node",
}

ENV_OTHER = frozenset({
    "GBROKER_CONFIG",
    # what gbroker sets in a job's environment (README, "Checkpoints", "Fan-out")
    "GBROKER_JOB_ID", "GBROKER_ATTEMPT", "GBROKER_CHECKPOINT_DIR", "GBROKER_RESUME_FROM",
    "GBROKER_WARNING_SIGNAL", "GBROKER_WARNING_SECONDS",
    "GBROKER_PIECE", "GBROKER_PIECE_FIRST", "GBROKER_PIECE_LAST", "GBROKER_PIECE_STEP",
    # what it sets for alert, notification and node-provider commands (docs/OPERATIONS.md, docs/PROVIDERS.md)
    "GBROKER_EVENT", "GBROKER_TEXT", "GBROKER_DELIVERY", "GBROKER_CLUSTER",
})
"""``GBROKER_*`` names that are not settings but mean something to gbroker."""

ENV_OTHER_PREFIXES = ("GBROKER_ALERT_", "GBROKER_DEVCLUSTER_", "GBROKER_TEST_", "GBROKER_CI_")
"""Prefixes of the same: alert commands' variables, and those of the dev cluster and test scripts (contrib/dev)."""

ENV_DEV = frozenset({
    "GBROKER_VENV", "GBROKER_ML_VENV", "GBROKER_ML_PYTHON", "GBROKER_SLURM_VERSION", "GBROKER_SLURM_ROOT",
    "GBROKER_SLURM_ROOTS", "GBROKER_DEBIAN_MIRROR", "GBROKER_DEMO_PORT", "GBROKER_DB_PASSWORD",
    "GBROKER_HOOK_LOG", "GBROKER_CRASH_AT", "GBROKER_ADRS_POLICY",
})
"""Names the dev, demo, test and benchmark scripts read (contrib/dev, tests)."""

_ENV_KNOWN = frozenset(_ENV) | ENV_OTHER | ENV_DEV


def env_notes(env: Mapping[str, str] | None = None) -> list[str]:
    """One line per ``GBROKER_*`` variable in ``env`` that gbroker does not know: a
    mistyped setting would otherwise be ignored in silence. Each names the closest
    setting when there is one."""
    env = os.environ if env is None else env
    unknown = sorted(name for name in env if name.startswith("GBROKER_") and name not in _ENV_KNOWN
                     and not name.startswith(ENV_OTHER_PREFIXES))
    if not unknown:
        return []
    import difflib  # only with something to report: this module is on every command's start-up path

    notes = []
    for name in unknown:
        close = difflib.get_close_matches(name, [*_ENV, "GBROKER_CONFIG"], n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]}?)" if close else ""
        notes.append(f"{name} is not a gbroker setting and is ignored{hint}; "
                     "the variables gbroker reads are listed in the README (\"The daemon\")")
    return notes


AT_LEAST_ZERO = ("max_spot_reclaims", "node_idle_seconds", "node_sweep_grace_seconds")
"""Number settings that may be 0; every other one must be above 0 (a period, a timeout, a size)."""


MAX_NUMBER = 10**9
"""The largest number setting (seconds, counts): a billion seconds is 31 years, so anything
larger is a typo, and would overflow the scheduler's timers."""

_NUMBER_TEXT = {"int": re.compile(r"[0-9]+"), "float": re.compile(r"[0-9]+(\.[0-9]+)?")}
"""A number in an environment variable: ASCII digits, no sign, exponent, '_' or spaces."""


def _coerce(name: str, value: Any, source: str) -> Any:
    kinds = {f.name: f.type for f in fields(Settings)}
    kind = kinds[name]
    kind_words = {"float": "number", "int": "whole number"}.get(str(kind), str(kind))
    try:
        if kind in ("float", "int"):
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, str):
                if source not in ("environment", "command line"):
                    raise ConfigError(f"{source}: {name} = {value!r} is a string, not a {kind_words}",
                                      hint=f"write it without quotes: {name} = {value.strip()}")
                if not _NUMBER_TEXT[str(kind)].fullmatch(value):
                    raise ValueError
            number = float(value) if kind == "float" else _whole_number(value)
            if not math.isfinite(number):
                raise ValueError
            zero_ok = name in AT_LEAST_ZERO
            if number < 0 or (number == 0 and not zero_ok) or number > MAX_NUMBER:
                raise ConfigError(f"{source}: {name} = {value!r} must be {'0 or more' if zero_ok else 'above 0'}"
                                  f" and at most {MAX_NUMBER:,}", hint=f"fix {name} in {source}")
            return number
        if not isinstance(value, str):
            raise ValueError
        return value
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(
            f"{source}: {name} = {value!r} is not a valid {kind_words}",
            hint=f"fix {name} in {source}",
        ) from None


def _whole_number(value: Any) -> int:
    """3 or "3"; never 2.9 cut to 2 (nor 3.0: a count is written whole)."""
    if isinstance(value, float):
        raise ValueError
    return int(value)


def _node_partitions(value: Any, source: str) -> tuple[NodePartition, ...]:
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ConfigError(
            f"{source}: [nodes] must hold one table per partition, e.g. [nodes.spot]",
            hint="write [nodes.<partition>] with keys " + ", ".join(NODE_PARTITION_KEYS),
        )
    out = []
    for name, table in sorted(value.items()):
        unknown = sorted(set(table) - set(NODE_PARTITION_KEYS))
        if unknown:
            raise ConfigError(
                f"{source}: unknown key(s) {', '.join(unknown)} in [nodes.{name}]",
                hint="known keys: " + ", ".join(NODE_PARTITION_KEYS),
            )
        try:
            idle = table.get("idle_seconds")
            warm = table.get("warm_min", 0)
            if isinstance(warm, bool) or not isinstance(warm, int) or warm < 0:
                raise ValueError("warm_min must be a whole number >= 0")
            if idle is not None and (isinstance(idle, bool) or not isinstance(idle, (int, float))
                                     or not math.isfinite(idle) or idle < 0 or idle > MAX_NUMBER):
                raise ValueError(f"idle_seconds must be a number of seconds from 0 to {MAX_NUMBER:,}, got {idle!r}")
            idle = None if idle is None else float(idle)
            price = table.get("price_per_node_hour")
            if price is not None:
                from broker.amount import parse_money

                if isinstance(price, (float, bool)):
                    raise ValueError('write price_per_node_hour as a string, e.g. "2.40" (money is exact)')
                if parse_money(str(price)) < 0:  # exact or refused, never a float
                    raise ValueError(f"price_per_node_hour must not be negative, got {price!r}")
                price = str(price)
            capacity = table.get("capacity")
            if capacity is not None and capacity not in CLASSES:
                raise ValueError(f"capacity must be one of {', '.join(CLASSES)}, not {capacity!r}")
            itype = table.get("instance_type")
            out.append(NodePartition(str(name), idle, warm, price, capacity,
                                     None if itype is None else str(itype)))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: [nodes.{name}]: {exc}", hint=f"fix [nodes.{name}] in {source}") from None
    return tuple(out)


def _providers(value: Any, source: str) -> str:
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ConfigError(
            f"{source}: [providers] must hold one table per provider, e.g. [providers.aws]",
            hint="see docs/PROVIDERS.md for each provider's settings",
        )
    return json.dumps(value, sort_keys=True, default=str)


TABLES = ("pools", "partitions", "nodes", "providers", "metrics", "notify", "web")
"""The settings file's tables (each parsed by its own reader below)."""


def _from_mapping(data: Mapping[str, Any], source: str) -> dict[str, Any]:
    known = {f.name for f in fields(Settings)} - {"node_partitions", "node_provider_settings", "pools",
                                                  "metrics", "notify", "web", "spot_partition", "ondemand_partition"}
    out: dict[str, Any] = {}
    if "pools" in data and "partitions" in data:
        raise ConfigError(f"{source}: [pools] and [partitions] both map partitions",
                          hint="keep [pools] (each pool names its partition) and drop [partitions]")
    for key, value in data.items():
        if key == "pools":
            out["pools"] = parse_pools(value, source)
            continue
        if key == "nodes":
            out["node_partitions"] = _node_partitions(value, source)
            continue
        if key == "providers":
            out["node_provider_settings"] = _providers(value, source)
            continue
        if key == "metrics":
            out["metrics"] = parse_metrics(value, source)
            continue
        if key == "notify":
            out["notify"] = parse_notify(value, source)
            continue
        if key == "web":
            out["web"] = parse_web(value, source)
            continue
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
                hint=('write [partitions] spot = "..." / ondemand = "...", or [pools.<name>] tables'
                      if key in ("spot_partition", "ondemand_partition") else
                      "known settings: " + ", ".join(sorted(known)) + "; tables: "
                      + ", ".join(f"[{t}]" for t in TABLES)),
            )
        out[key] = _coerce(key, value, source)
    if "slurm_bin_dir" in out and not str(out["slurm_bin_dir"]).startswith("/"):
        raise ConfigError(f"{source}: slurm_bin_dir must be an absolute path, not {out['slurm_bin_dir']!r}",
                          hint="e.g. slurm_bin_dir = \"/usr/bin\"")
    if "timezone" in out:
        _check_zone(out["timezone"], source)
    if "currency" in out and not (len(out["currency"]) == 3 and out["currency"].isascii()
                                  and out["currency"].isupper()):
        raise ConfigError(f"{source}: currency = {out['currency']!r} is not an ISO 4217 code",
                          hint='three capital letters, e.g. currency = "EUR"')
    return out


def _check_zone(name: str, source: str) -> None:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"{source}: timezone = {name!r} is not a time zone",
                          hint='give an IANA name, e.g. timezone = "Europe/Berlin" (see timedatectl list-timezones)'
                          ) from None


def load_settings(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Resolve the settings once: defaults < file < environment < flags."""
    env = os.environ if env is None else env
    settings = Settings()
    data, source = _settings_file(path, env)
    if data is not None:
        settings = replace(settings, **_from_mapping(data, source))
    from_env = {attr: env[var] for var, attr in _ENV.items() if env.get(var)}
    settings = replace(settings, **_from_mapping(from_env, "environment"))
    if overrides:
        clean = {k: v for k, v in overrides.items() if v is not None}
        if "hook_user" in clean:
            raise ConfigError("hook_user can only be set in the config file",
                              hint="it decides who alert commands run as; only root edits the config file")
        settings = replace(settings, **_from_mapping(clean, "command line"))
    _check_capacities(settings)
    _check_choices(settings)
    return settings


def _settings_file(path: str | os.PathLike[str] | None, env: Mapping[str, str]) -> tuple[dict[str, Any] | None, str]:
    """The settings file's tables as TOML reads them (None: there is none) and its name."""
    file_path = Path(path) if path else Path(env.get("GBROKER_CONFIG") or DEFAULT_CONFIG_PATH)  # empty: unset
    if not file_path.exists():
        if path:
            raise ConfigError(f"config file {file_path} does not exist")
        return None, str(file_path)
    try:
        return tomllib.loads(file_path.read_text()), str(file_path)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {file_path}: {exc}", hint="fix the file") from None


def client_socket(path: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None) -> str:
    """The daemon's socket, as a client finds it: ``GBROKER_SOCKET``, else the settings file's
    ``socket``, else the default.

    Only ``socket`` is read from the file. The rest is the daemon's, which refuses to start on
    anything wrong there, as ``gbroker config check`` does: so a setting this client does not
    know (one of a newer gbroker than a user's own install) or a mistake in a table only root
    can fix does not stop every user's commands."""
    env = os.environ if env is None else env
    if env.get("GBROKER_SOCKET"):
        return str(_coerce("socket", env["GBROKER_SOCKET"], "environment"))
    data, source = _settings_file(path, env)
    if data is not None and "socket" in data:
        return str(_coerce("socket", data["socket"], source))
    return default_socket_path()


SLURM_SUBMIT_WAYS = ("auto", "sbatch", "libslurm")
"""The values of ``slurm_submit``, how jobs are queued: libslurm in the daemon when it is built for
this Slurm ("auto"), else sbatch as the user; or always one way. The Slurm backend checks against these too."""
_CHOICES = {"slurm_backend": ("auto", "cli", "pyslurm"), "slurm_submit": SLURM_SUBMIT_WAYS}


def _check_choices(settings: Settings) -> None:
    for name, allowed in _CHOICES.items():
        value = getattr(settings, name)
        if value not in allowed:
            raise ConfigError(f"{name} = {value!r} is not one of: {', '.join(allowed)}",
                              hint=f"set {name} to one of those")


def _check_capacities(settings: Settings) -> None:
    """A ``[nodes.<p>]`` capacity may not contradict the catalog: one map, one answer.

    With ``[pools]``, a pool's partition takes its node keys from the pool, so a
    ``[nodes.<p>]`` table for it is refused (it would be a second answer).
    """
    if settings.pools:
        check_unique(settings.pools, "settings")
        for rule in settings.node_partitions:
            pool = settings.pool_of(rule.name)
            if pool is not None:
                raise ConfigError(
                    f"[nodes.{rule.name}] is the partition of pool {pool.name!r}",
                    hint=f"move its keys (idle_seconds, warm_min, ...) into [pools.{pool.name}] and drop [nodes.{rule.name}]",
                )
        return
    for cap in ("spot", "ondemand"):
        part = getattr(settings, f"{cap}_partition")
        if not POOL_NAME_RE.fullmatch(part):
            raise ConfigError(f"[partitions] {cap} = {part!r} is not a Slurm partition name",
                              hint="letters, digits, '.', '_' and '-', starting with a letter or digit")
    if settings.spot_partition == settings.ondemand_partition:
        raise ConfigError(f"[partitions] names {settings.spot_partition!r} for both spot and on-demand",
                          hint="on-demand jobs would run on spot nodes: give each its own partition")
    for rule in settings.node_partitions:
        named = {settings.spot_partition: "spot", settings.ondemand_partition: "ondemand"}.get(rule.name)
        if rule.capacity is not None and named is not None and rule.capacity != named:
            raise ConfigError(
                f"[nodes.{rule.name}] capacity = {rule.capacity!r}, but [partitions] names {rule.name!r} "
                f"the {named} partition",
                hint=f"drop capacity from [nodes.{rule.name}] or set it to {named!r}",
            )


MIGRATE_HINT = (
    "settings use [partitions] (two pools: spot and ondemand); to declare owned or reserved nodes, GPU types "
    "and several spot zones, write [pools.<name>] tables instead (docs/POOLS.md)"
)
"""Said once in the daemon's log when the settings have no pool catalog."""
