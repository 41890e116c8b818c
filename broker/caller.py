"""Who asks: the caller of a request, as the kernel named it, and the shape of a request handler.

The socket server (``broker.api``) builds a ``Caller`` from SO_PEERCRED;
the domains only read it. A handler takes the caller and the request's
arguments and returns what is sent back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.errors import PermissionDenied


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
