"""The operations settings: ``[metrics]`` (the TCP listener), ``[web]`` (its dashboard) and ``[notify]``.

Parsed and checked when the settings load, so ``gbroker config check`` and
the daemon refuse the same mistakes with the same message. Standard library
only: the CLI loads it with the settings.

::

    [metrics]
    listen = "127.0.0.1:9464"       # off when absent; a non-loopback address needs allow_remote
    allow_remote = false
    ready_tick_age_seconds = 0      # 0: three reconcile ticks (at least 30 s)

    [web]
    trust_proxy_header = ""         # e.g. "X-Forwarded-User": the proxy names the user (off: sign in by token)
    proxy_secret_file = ""          # required with it: root-only file; the proxy sends it as X-Gbroker-Proxy-Secret

    [notify]
    tick_seconds = 10               # how often the outbox is delivered
    max_tries = 10                  # then the message is given up (kept, marked dead)
    backoff_seconds = 30            # first retry delay; doubles each try
    backoff_max_seconds = 3600
    timeout_seconds = 10            # per delivery

    [notify.targets.lab-slack]
    kind = "webhook"                # webhook | email | command
    url = "https://hooks.slack.com/services/..."
    secret = "..."                  # HMAC-SHA256 key (X-Gbroker-Signature)

    [[notify.subscriptions]]
    target = "lab-slack"
    groups = ["vision"]             # and/or users = ["alice"]; neither: every job and budget
    events = ["job.failed", "budget.threshold"]   # absent: all of EVENTS
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from broker.errors import ConfigError

EVENTS = (
    "job.completed",
    "job.failed",
    "job.reclaimed",
    "job.moved_to_ondemand",
    "job.deadline_at_risk",
    "budget.threshold",
)
"""What a subscription can ask for."""

TARGET_KINDS = ("webhook", "email", "command")
TARGET_KEYS = {
    "webhook": ("kind", "url", "secret"),
    "email": ("kind", "to", "to_owner", "mail_domain", "sender", "user"),
    "command": ("kind", "argv", "user"),
}
SENDMAIL = "/usr/sbin/sendmail"


@dataclass(frozen=True)
class MetricsSettings:
    host: str = ""
    """'' = no listener."""
    port: int = 0
    allow_remote: bool = False
    ready_tick_age_seconds: float = 0.0

    @property
    def enabled(self) -> bool:
        return bool(self.host)


PROXY_SECRET_HOWTO = "umask 077; head -c 32 /dev/urandom | base64 > FILE"
"""How to make the proxy's secret file, readable by root alone (said wherever one is asked for)."""


@dataclass(frozen=True)
class WebSettings:
    trust_proxy_header: str = ""
    """A reverse proxy's header naming the signed-in user ('' = off: the dashboard asks for a token).
    Honoured only on a request that also carries the proxy's secret (``proxy_secret_file``): any
    local user can reach a loopback listener."""
    proxy_secret_file: str = ""
    """A file only root can read holding the secret the proxy sends in ``X-Gbroker-Proxy-Secret``;
    read by the daemon at start. Required with ``trust_proxy_header``."""
    max_tokens_per_user: int = 20
    """Live dashboard tokens one user may hold; ``gbroker token`` refuses past it (revoke one first)."""


@dataclass(frozen=True)
class Target:
    name: str
    kind: str
    url: str = ""
    secret: str = ""
    to: tuple[str, ...] = ()
    to_owner: bool = False
    mail_domain: str = ""
    sender: str = "gbroker"
    argv: tuple[str, ...] = ()
    user: str = ""
    """Who an email or command runs as; '' = the settings' hook_user."""

    def public(self) -> dict[str, Any]:
        """The target as ``gbroker config check`` prints it (the secret is not shown)."""
        out: dict[str, Any] = {"kind": self.kind}
        if self.kind == "webhook":
            out.update(url=self.url, signed=bool(self.secret))
        elif self.kind == "email":
            out.update(to=list(self.to), to_owner=self.to_owner, mail_domain=self.mail_domain)
        else:
            out.update(argv=list(self.argv))
        if self.user:
            out["user"] = self.user
        return out


@dataclass(frozen=True)
class Subscription:
    target: str
    events: tuple[str, ...] = EVENTS
    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()

    def matches(self, event: str, user: str | None, group: str | None) -> bool:
        if event not in self.events:
            return False
        if not self.users and not self.groups:
            return True
        return (user is not None and user in self.users) or (group is not None and group in self.groups)


@dataclass(frozen=True)
class NotifySettings:
    targets: tuple[Target, ...] = ()
    subscriptions: tuple[Subscription, ...] = ()
    tick_seconds: float = 10.0
    max_tries: int = 10
    backoff_seconds: float = 30.0
    backoff_max_seconds: float = 3600.0
    timeout_seconds: float = 10.0

    def target(self, name: str) -> Target | None:
        return next((t for t in self.targets if t.name == name), None)


def parse_metrics(value: Any, source: str) -> MetricsSettings:
    where = f"{source}: [metrics]"
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a table", hint='e.g. [metrics] listen = "127.0.0.1:9464"')
    _unknown(value, ("listen", "allow_remote", "ready_tick_age_seconds"), where)
    allow = value.get("allow_remote", False)
    if not isinstance(allow, bool):
        raise ConfigError(f"{where}: allow_remote must be true or false")
    age = _number(value.get("ready_tick_age_seconds", 0), f"{where} ready_tick_age_seconds", minimum=0)
    listen = value.get("listen", "")
    if not isinstance(listen, str):
        raise ConfigError(f"{where}: listen must be a string", hint='e.g. listen = "127.0.0.1:9464"')
    if not listen:
        return MetricsSettings(allow_remote=allow, ready_tick_age_seconds=age)
    m = re.fullmatch(r"\[?([^\]]*?)\]?:(\d{1,5})", listen)
    if m is None or not 0 < int(m.group(2)) < 65536:
        raise ConfigError(f"{where}: listen = {listen!r} is not HOST:PORT",
                          hint='e.g. listen = "127.0.0.1:9464" (or "[::1]:9464")')
    host, port = m.group(1), int(m.group(2))
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"{where}: listen = {listen!r}: give an IP address, not a host name",
                          hint='e.g. listen = "127.0.0.1:9464"') from None
    if not addr.is_loopback and not allow:
        raise ConfigError(
            f"{where}: listen = {listen!r} is reachable from other machines",
            hint="the metrics and health pages have no login: keep 127.0.0.1, or set allow_remote = true "
                 "and firewall the port",
        )
    return MetricsSettings(host=host, port=port, allow_remote=allow, ready_tick_age_seconds=age)


def parse_web(value: Any, source: str) -> WebSettings:
    where = f"{source}: [web]"
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a table", hint='e.g. [web] trust_proxy_header = "X-Forwarded-User"')
    _unknown(value, ("trust_proxy_header", "proxy_secret_file", "max_tokens_per_user"), where)
    cap = value.get("max_tokens_per_user", WebSettings.max_tokens_per_user)
    if isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= 1000:
        raise ConfigError(f"{where}: max_tokens_per_user = {str(cap)[:40]!r} is not a whole number from 1 to 1000",
                          hint="e.g. max_tokens_per_user = 20 (the default)")
    header = _string(value.get("trust_proxy_header", ""), f"{where} trust_proxy_header")
    secret = _string(value.get("proxy_secret_file", ""), f"{where} proxy_secret_file")
    if header and not re.fullmatch(r"[A-Za-z0-9-]{1,64}", header):
        raise ConfigError(f"{where}: trust_proxy_header = {header!r} is not a header name",
                          hint='e.g. trust_proxy_header = "X-Forwarded-User", or "" to turn it off')
    if header.lower() in ("cookie", "host", "origin", "content-type", "content-length"):
        raise ConfigError(f"{where}: trust_proxy_header = {header!r} is a header browsers send themselves",
                          hint='use the proxy\'s own header, e.g. "X-Forwarded-User"')
    make = ("create it readable by root alone: " + PROXY_SECRET_HOWTO.replace("FILE", "/etc/gbroker/proxy-secret")
            + "; have the proxy send its content as X-Gbroker-Proxy-Secret")
    if header and not secret:
        raise ConfigError(f"{where}: trust_proxy_header needs proxy_secret_file: without it any local user "
                          "can send the header to the listener and be whoever it names",
                          hint=f'set proxy_secret_file = "/etc/gbroker/proxy-secret" and {make}')
    if secret and not header:
        raise ConfigError(f"{where}: proxy_secret_file is set but trust_proxy_header is not, so it would do nothing",
                          hint='set trust_proxy_header (e.g. "X-Forwarded-User"), or remove proxy_secret_file')
    if secret and not secret.startswith("/"):
        raise ConfigError(f"{where}: proxy_secret_file = {secret!r} is not an absolute path",
                          hint='e.g. proxy_secret_file = "/etc/gbroker/proxy-secret"')
    return WebSettings(trust_proxy_header=header, proxy_secret_file=secret, max_tokens_per_user=cap)


def parse_notify(value: Any, source: str) -> NotifySettings:
    where = f"{source}: [notify]"
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a table")
    _unknown(value, ("targets", "subscriptions", "tick_seconds", "max_tries", "backoff_seconds",
                     "backoff_max_seconds", "timeout_seconds"), where)
    raw_targets = value.get("targets", {})
    if not isinstance(raw_targets, dict) or not all(isinstance(t, dict) for t in raw_targets.values()):
        raise ConfigError(f"{where}: targets must be one table per target, e.g. [notify.targets.lab-slack]")
    targets = tuple(_target(name, table, f"{source}: [notify.targets.{name}]")
                    for name, table in sorted(raw_targets.items()))
    raw_subs = value.get("subscriptions", [])
    if not isinstance(raw_subs, list) or not all(isinstance(s, dict) for s in raw_subs):
        raise ConfigError(f"{where}: subscriptions must be a list of tables, [[notify.subscriptions]]")
    names = {t.name for t in targets}
    subs = tuple(_subscription(i, table, names, f"{source}: [[notify.subscriptions]] #{i + 1}")
                 for i, table in enumerate(raw_subs))
    max_tries = value.get("max_tries", 10)
    if isinstance(max_tries, bool) or not isinstance(max_tries, int) or max_tries < 1:
        raise ConfigError(f"{where}: max_tries must be a whole number >= 1, not {max_tries!r}")
    return NotifySettings(
        targets=targets, subscriptions=subs, max_tries=max_tries,
        tick_seconds=_number(value.get("tick_seconds", 10), f"{where} tick_seconds", minimum=0.1),
        backoff_seconds=_number(value.get("backoff_seconds", 30), f"{where} backoff_seconds", minimum=0.01),
        backoff_max_seconds=_number(value.get("backoff_max_seconds", 3600), f"{where} backoff_max_seconds",
                                    minimum=0.01),
        timeout_seconds=_number(value.get("timeout_seconds", 10), f"{where} timeout_seconds", minimum=0.1),
    )


def _target(name: str, table: dict[str, Any], where: str) -> Target:
    kind = table.get("kind")
    if kind not in TARGET_KINDS:
        raise ConfigError(f"{where}: kind = {kind!r}", hint="kind is one of " + ", ".join(TARGET_KINDS))
    _unknown(table, TARGET_KEYS[kind], where)
    user = _string(table.get("user", ""), f"{where} user")
    if kind == "webhook":
        url = _string(table.get("url", ""), f"{where} url")
        if not re.match(r"^https?://[^\s/]+", url):
            raise ConfigError(f"{where}: url = {url!r} is not an http:// or https:// URL")
        return Target(name, kind, url=url, secret=_string(table.get("secret", ""), f"{where} secret"))
    if kind == "email":
        to = table.get("to", [])
        if not isinstance(to, list) or not all(isinstance(a, str) and re.fullmatch(r"[^@\s]+@[^@\s]+", a)
                                               for a in to):
            raise ConfigError(f"{where}: to must be a list of mail addresses", hint='e.g. to = ["ops@lab.example"]')
        to_owner = table.get("to_owner", False)
        if not isinstance(to_owner, bool):
            raise ConfigError(f"{where}: to_owner must be true or false")
        domain = _string(table.get("mail_domain", ""), f"{where} mail_domain")
        if not to and not to_owner:
            raise ConfigError(f"{where}: says nobody to write to", hint="give to = [...] or to_owner = true")
        return Target(name, kind, to=tuple(to), to_owner=to_owner, mail_domain=domain,
                      sender=_string(table.get("sender", "gbroker"), f"{where} sender"), user=user)
    argv = table.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise ConfigError(f"{where}: argv must be a list: the program and its arguments",
                          hint='e.g. argv = ["/usr/local/bin/page-oncall", "--team", "gpu"]')
    if not argv[0].startswith("/"):
        raise ConfigError(f"{where}: argv[0] = {argv[0]!r}: give the program's absolute path")
    return Target(name, kind, argv=tuple(argv), user=user)


def _subscription(i: int, table: dict[str, Any], targets: set[str], where: str) -> Subscription:
    _unknown(table, ("target", "events", "users", "groups"), where)
    target = table.get("target")
    if target not in targets:
        raise ConfigError(f"{where}: target = {target!r} is not a [notify.targets.NAME]",
                          hint="targets: " + (", ".join(sorted(targets)) or "none defined"))
    events = table.get("events", list(EVENTS))
    if isinstance(events, list) and not events:
        raise ConfigError(f"{where}: events = [] subscribes to nothing",
                          hint="name the events, or leave events out for all: " + ", ".join(EVENTS))
    if not isinstance(events, list) or any(e not in EVENTS for e in events):
        bad = [e for e in events if e not in EVENTS] if isinstance(events, list) else events
        raise ConfigError(f"{where}: unknown event(s) {bad!r}", hint="events: " + ", ".join(EVENTS))
    lists = {}
    for key in ("users", "groups"):
        got = table.get(key, [])
        if not isinstance(got, list) or not all(isinstance(x, str) and x for x in got):
            raise ConfigError(f"{where}: {key} must be a list of names")
        lists[key] = tuple(x.lower() if key == "groups" else x for x in got)
    return Subscription(str(target), tuple(events), lists["users"], lists["groups"])


def _unknown(table: dict[str, Any], known: tuple[str, ...], where: str) -> None:
    extra = sorted(set(table) - set(known))
    if extra:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(extra)}", hint="known keys: " + ", ".join(known))


def _number(value: Any, where: str, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise ConfigError(f"{where} = {value!r}: give a number >= {minimum:g}")
    return float(value)


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where} must be a string, not {value!r}")
    return value
