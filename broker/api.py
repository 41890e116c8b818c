"""The socket server inside the daemon: identity and authorisation.

Identity comes from the kernel (SO_PEERCRED on the UNIX socket), never from
the request. Each connection carries one request and one answer (see
``broker.client`` for the wire format). Handlers run in threads; the service
layer serialises writes.
"""

from __future__ import annotations

import grp
import json
import logging
import os
import pwd
import socket
import socketserver
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.errors import BrokerError, PermissionDenied

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 8 * 1024 * 1024


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


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, from the kernel."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def caller_from_ids(pid: int, uid: int, gid: int, admin_group: str) -> Caller:
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    is_admin = uid == 0
    if not is_admin:
        try:
            group = grp.getgrnam(admin_group)
            is_admin = name in group.gr_mem or group.gr_gid == gid or group.gr_gid in os.getgrouplist(name, gid)
        except KeyError:
            is_admin = False
    return Caller(uid=uid, gid=gid, pid=pid, name=name, is_admin=is_admin)


Handler = Callable[[Caller, dict[str, Any]], Any]


class _RequestHandler(socketserver.StreamRequestHandler):
    server: ApiServer

    def handle(self) -> None:
        try:
            pid, uid, gid = peer_credentials(self.request)
        except OSError:
            log.warning("could not read peer credentials; closing connection")
            return
        line = self.rfile.readline(MAX_REQUEST_BYTES + 1)
        answer = self.server.dispatch(pid, uid, gid, line)
        try:
            self.wfile.write((json.dumps(answer, default=str) + "\n").encode())
        except BrokenPipeError:
            log.info("client pid %s went away before the answer", pid)


class ApiServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """Threaded UNIX socket server; ``handlers`` maps op names to functions."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    """A burst of CLI calls (20 submits at once) must queue, not be refused."""

    def __init__(self, path: str, handlers: dict[str, Handler], admin_group: str) -> None:
        self.path = path
        self.handlers = handlers
        self.admin_group = admin_group
        sock_path = Path(path)
        sock_path.parent.mkdir(parents=True, exist_ok=True)
        if sock_path.exists() or sock_path.is_symlink():
            _remove_stale_socket(sock_path)
        super().__init__(path, _RequestHandler)
        # Anyone may connect: who they are is read from the kernel, not trusted from them.
        os.chmod(path, 0o666)

    def dispatch(self, pid: int, uid: int, gid: int, line: bytes) -> dict[str, Any]:
        if len(line) > MAX_REQUEST_BYTES:
            return _error(BrokerError("request too large", hint="keep job scripts under 1 MiB"))
        try:
            msg = json.loads(line)
            op = msg["op"]
            args = msg.get("args") or {}
            if not isinstance(args, dict) or not isinstance(op, str):
                raise ValueError
        except (ValueError, KeyError, TypeError):
            return _error(BrokerError("malformed request", hint="use the gbroker command-line client"))
        handler = self.handlers.get(op)
        if handler is None:
            return _error(
                BrokerError(f"unknown operation {op!r}", hint="client and daemon versions may differ")
            )
        caller = caller_from_ids(pid, uid, gid, self.admin_group)
        try:
            return {"ok": True, "result": handler(caller, args)}
        except BrokerError as exc:
            return _error(exc)
        except Exception as exc:  # a bug: tell the client, keep serving
            log.exception("handler %s failed for uid %s", op, uid)
            return _error(BrokerError(f"internal error in {op}: {exc}", hint="see the daemon log"))

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="gbroker-api", daemon=True)
        thread.start()
        return thread

    def server_close(self) -> None:
        super().server_close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _remove_stale_socket(path: Path) -> None:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()
        return
    finally:
        probe.close()
    raise BrokerError(
        f"another process answers on {path}",
        hint="a daemon is already running; stop it first or use another --socket",
    )


def _error(exc: BrokerError) -> dict[str, Any]:
    return {
        "ok": False,
        "error": {
            "type": type(exc).__name__,
            "message": exc.message,
            "hint": exc.hint or "",
            "exit_code": exc.exit_code,
        },
    }
