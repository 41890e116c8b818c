"""Who asks: the caller of a request, as the kernel named it, and the shape of a request handler.

The socket server (``broker.api``) builds a ``Caller`` from SO_PEERCRED;
the domains only read it. A handler takes the caller and the request's
arguments and returns what is sent back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.errors import PermissionDenied, SpecError


@dataclass(frozen=True)
class Caller:
    """Who is on the other end of the socket, as the kernel says."""

    uid: int
    gid: int
    pid: int
    name: str
    is_admin: bool

    def require_admin(self, what: str) -> None:
        if not self.is_admin:
            raise PermissionDenied(
                f"{what} is for gbroker admins; user {self.name} (uid {self.uid}) is not one",
                hint="ask a lab admin to run it, or to add you to the admin group",
            )


Handler = Callable[[Caller, dict[str, Any]], Any]
"""A socket operation: (caller, arguments) -> the JSON-able answer."""


# -- argument checks: every value a request carries is checked before use ---------------------
def only_args(args: dict[str, Any], op: str, *allowed: str) -> None:
    """Refuse a request argument the operation does not know (nothing a client sends is ignored)."""
    extra = sorted(set(args) - set(allowed))
    if extra:
        raise SpecError(f"{op}: unknown argument {', '.join(repr(e)[:40] for e in extra[:5])}",
                        hint="client and daemon versions may differ")


def bool_arg(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise SpecError(f"{name}: expected true or false, got {str(value)[:40]!r}")
    return value


def int_arg(value: Any, name: str, lo: int, hi: int) -> int:
    """A whole number from lo to hi (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{name}: expected a whole number, got {str(value)[:40]!r}")
    if not lo <= value <= hi:
        raise SpecError(f"{name}: must be between {lo} and {hi}, got {str(value)[:40]}")
    return value
