"""The socket server inside the daemon: identity, limits, dispatch.

Identity comes from the kernel (SO_PEERCRED on the UNIX socket), never from
the request. Each connection carries one request and one answer: a JSON line
(``broker.client``, the CLI's wire) or an HTTP/1.1 request (``broker.http_wire``,
for curl and other programs), told apart by the first line.

The daemon runs as root and serves every user of the lab, so one user must
not be able to starve the others. Every connection is bounded:

* at most ``max_connections`` are served at once (one thread each), and at
  most ``max_per_uid`` for one uid; more connections wait their turn in a
  queue per uid, costing a file descriptor and no thread, up to
  ``max_waiting_per_uid`` (and ``max_waiting`` in all); beyond that a
  connection gets a "busy" answer at once (the client retries). So one
  user's idle or slow connections delay only that user;
* a request must arrive whole within ``read_timeout_s`` and be at most
  ``max_request_bytes``; a larger one is read to its end (up to a bound) and
  dropped, so the client still gets the "too large" answer;
* handlers never hold the daemon's write lock across a Slurm call or a
  user's file (see ``broker.userfiles``), so no request waits on another
  user's slow one.
"""

from __future__ import annotations

import grp
import json
import logging
import os
import pwd
import selectors
import socket
import struct
import sys
import threading
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker import http_wire
from broker.caller import Caller, Handler
from broker.errors import BrokerError, PermissionDenied

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """Bounds on what one connection, one uid and all of them together may cost."""

    max_connections: int = 64
    """Connections served at once (each holds one thread)."""
    max_per_uid: int = 8
    """Connections one uid may have served at once."""
    max_waiting_per_uid: int = 64
    """Connections of one uid waiting for a free slot (no thread, no read yet)."""
    max_waiting: int = 512
    """Waiting connections in all."""
    max_request_bytes: int = 2 * 1024 * 1024
    """A job script is at most 1 MiB; a request is that plus its fields."""
    read_timeout_s: float = 10.0
    """The whole request must arrive within this."""
    write_timeout_s: float = 10.0
    drain_max_bytes: int = 64 * 1024 * 1024
    """How much of an oversized request is read and dropped so its sender still gets the answer."""
    slow_request_s: float = 1.0
    """Requests slower than this are logged."""
    switch_interval_s: float = 0.0005
    """How long a thread may keep the interpreter while others wait (``sys.setswitchinterval``;
    Python's default is 5 ms). A request that waits on the database or a child gives the
    interpreter up and must win it back each time; among busy submitting threads, at 5 ms a
    go, a user's short read would wait a second in all."""


class Busy(BrokerError):
    """The daemon serves as many connections as it may; try again shortly."""

    exit_code = 6


class RequestTooLarge(BrokerError):
    exit_code = 2


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, from the kernel."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def caller_from_ids(pid: int, uid: int, gid: int, admin_group: str) -> Caller:
    """The caller the kernel names. A uid the host has no account for is refused: jobs run as
    the account's name, and a made-up one (``str(uid)``) could be another account's."""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        raise PermissionDenied(f"uid {uid} has no account on this host (no passwd entry)",
                               hint="gbroker serves the users this host knows: run it as your own account, "
                                    "not from a user namespace or a container's uid") from None
    is_admin = uid == 0
    if not is_admin:
        try:
            group = grp.getgrnam(admin_group)
            is_admin = name in group.gr_mem or group.gr_gid == gid or group.gr_gid in os.getgrouplist(name, gid)
        except KeyError:
            is_admin = False
    return Caller(uid=uid, gid=gid, pid=pid, name=name, is_admin=is_admin)


def caller_for_uid(uid: int, admin_group: str) -> Caller:
    """The caller a dashboard sign-in names (a token bound to ``uid``): as the socket would see that user."""
    try:
        gid = pwd.getpwuid(uid).pw_gid
    except KeyError:
        gid = uid
    return caller_from_ids(0, uid, gid, admin_group)




class ApiServer:
    """The daemon's UNIX socket: accepts, admits within the limits, serves from a bounded pool."""

    def __init__(
        self, path: str, handlers: dict[str, Handler], admin_group: str, limits: Limits | None = None
    ) -> None:
        self.path = path
        self.handlers = handlers
        self.admin_group = admin_group
        self.limits = limits or Limits()
        sock_path = Path(path)
        if not sock_path.parent.exists():
            # Everyone must reach the socket; the directory holds nothing else.
            sock_path.parent.mkdir(parents=True)
            os.chmod(sock_path.parent, 0o755)
        if sock_path.exists() or sock_path.is_symlink():
            _remove_stale_socket(sock_path)
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.socket.bind(path)
        # Anyone may connect: who they are is read from the kernel, not trusted from them.
        os.chmod(path, 0o666)
        self.socket.listen(256)
        self.socket.setblocking(False)
        self._pool = ThreadPoolExecutor(max_workers=self.limits.max_connections, thread_name_prefix="gbroker-api")
        self._lock = threading.Lock()
        self._open: Counter[int] = Counter()
        self._waiting: dict[int, deque[tuple[socket.socket, int, int]]] = {}
        self._stop = threading.Event()
        self._stopped = threading.Event()

    # -- accepting -------------------------------------------------------------
    def serve_forever(self) -> None:
        sys.setswitchinterval(self.limits.switch_interval_s)
        sel = selectors.DefaultSelector()
        sel.register(self.socket, selectors.EVENT_READ)
        try:
            while not self._stop.is_set():
                if not sel.select(timeout=0.5):
                    continue
                while True:
                    try:
                        conn, _ = self.socket.accept()
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError as exc:  # EMFILE and the like: back off, keep serving
                        log.warning("accept failed: %s", exc)
                        time.sleep(0.05)
                        break
                    self._admit(conn)
        finally:
            sel.close()
            self._stopped.set()

    def _admit(self, conn: socket.socket) -> None:
        conn.setblocking(True)
        try:
            pid, uid, gid = peer_credentials(conn)
        except OSError:
            conn.close()
            return
        lim = self.limits
        with self._lock:
            waiting = sum(len(q) for q in self._waiting.values())
            if self._can_start(uid):
                self._open[uid] += 1
                start = True
            elif len(self._waiting.get(uid, ())) < lim.max_waiting_per_uid and waiting < lim.max_waiting:
                self._waiting.setdefault(uid, deque()).append((conn, pid, gid))
                return
            else:
                start = False
        if not start:
            self._reply_now(conn, Busy(
                f"the gbroker daemon is busy: uid {uid} has {self._open[uid]} requests in progress "
                f"and {len(self._waiting.get(uid, ()))} waiting",
                hint="retry in a moment; gbroker's own client does so by itself"))
            return
        self._start(conn, pid, uid, gid)

    def _can_start(self, uid: int) -> bool:
        return self._open[uid] < self.limits.max_per_uid and sum(self._open.values()) < self.limits.max_connections

    def _start(self, conn: socket.socket, pid: int, uid: int, gid: int) -> None:
        try:
            self._pool.submit(self._serve, conn, pid, uid, gid)
        except RuntimeError:  # the pool is shutting down
            conn.close()
            self._done(uid)

    def _done(self, uid: int) -> None:
        """A served connection ended: its slot goes to a waiting one (its uid's first, then others')."""
        nxt: tuple[socket.socket, int, int, int] | None = None
        with self._lock:
            self._open[uid] -= 1
            if self._open[uid] <= 0:
                del self._open[uid]
            for candidate in [uid, *[u for u in self._waiting if u != uid]]:
                queue = self._waiting.get(candidate)
                if queue and self._can_start(candidate):
                    conn, pid, gid = queue.popleft()
                    if not queue:
                        del self._waiting[candidate]
                    self._open[candidate] += 1
                    nxt = (conn, pid, candidate, gid)
                    break
        if nxt is not None:
            self._start(nxt[0], nxt[1], nxt[2], nxt[3])

    def open_connections(self) -> dict[int, int]:
        """uid -> connections being served now."""
        with self._lock:
            return dict(self._open)

    def waiting_connections(self) -> dict[int, int]:
        with self._lock:
            return {uid: len(q) for uid, q in self._waiting.items()}

    # -- serving ---------------------------------------------------------------
    def _serve(self, conn: socket.socket, pid: int, uid: int, gid: int) -> None:
        started = time.monotonic()
        op = "?"
        try:
            op = self._serve_one(conn, pid, uid, gid, started + self.limits.read_timeout_s)
        except Exception as exc:  # a bug: the client is told, the log says where, the daemon serves on
            log.exception("request from uid %s (pid %s) failed", uid, pid)
            self._write(conn, _error(_internal(exc)))
        finally:
            self._done(uid)
            conn.close()
            took = time.monotonic() - started
            if took > self.limits.slow_request_s:
                log.info("request %s from uid %s took %.2fs", op, uid, took)

    def _serve_one(self, conn: socket.socket, pid: int, uid: int, gid: int, deadline: float) -> str:
        """Read one request, answer it; the op name it called (for the log)."""
        try:
            line, rest = self._read_line(conn, deadline)
            if http_wire.is_http(line):
                return self._serve_http(conn, pid, uid, gid, line, rest, deadline)
        except RequestTooLarge as exc:
            self._write(conn, _error(exc))
            return "?"
        except (TimeoutError, OSError) as exc:
            log.info("uid %s (pid %s): request not received (%s)", uid, pid, exc or "timed out")
            return "?"
        op, answer = self.dispatch(pid, uid, gid, line)
        self._write(conn, answer)
        return op

    def _read_line(self, conn: socket.socket, deadline: float) -> tuple[bytes, bytes]:
        """The first line and what came after it in the same read; RequestTooLarge past the
        limit (after reading the rest, within bounds)."""
        lim = self.limits
        buf = bytearray()
        while True:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = conn.recv(65536)
            if not chunk:
                return bytes(buf), b""
            nl = chunk.find(b"\n")
            if nl >= 0:
                buf += chunk[: nl + 1]
                if len(buf) > lim.max_request_bytes:
                    break
                return bytes(buf), chunk[nl + 1:]
            buf += chunk
            if len(buf) > lim.max_request_bytes:
                self._drain(conn, deadline, lim.drain_max_bytes - len(buf))
                break
            if time.monotonic() >= deadline:
                raise TimeoutError
        raise RequestTooLarge(
            f"request too large (more than {lim.max_request_bytes // (1024 * 1024)} MiB)",
            hint="keep job scripts under 1 MiB; put large inputs in files",
        )

    # -- HTTP/1.1 (broker.http_wire) ---------------------------------------------
    def _serve_http(self, conn: socket.socket, pid: int, uid: int, gid: int, first: bytes, rest: bytes,
                    deadline: float) -> str:
        """One HTTP request on the connection; the op name it called (for the log). A bug anywhere
        in it is answered 500 and logged, never a connection closed without a word."""
        try:
            return self._answer_http(conn, pid, uid, gid, first, rest, deadline)
        except OSError:  # the client went away or was too slow: nothing to answer, the caller logs it
            raise
        except Exception as exc:
            log.exception("HTTP request from uid %s (pid %s) failed", uid, pid)
            self._send(conn, http_wire.response(500, http_wire.error_payload(_internal(exc))))
            return "http?"

    def _answer_http(self, conn: socket.socket, pid: int, uid: int, gid: int, first: bytes, rest: bytes,
                     deadline: float) -> str:
        try:
            head, body = self._read_http(conn, first, rest, deadline)
            routed = http_wire.route(head, body, sorted(self.handlers))
        except (http_wire.HttpError, RequestTooLarge) as exc:
            status = exc.status if isinstance(exc, http_wire.HttpError) else 413
            log.info("uid %s (pid %s): HTTP request refused (%s): %s", uid, pid, status, exc.message)
            self._send(conn, http_wire.response(status, http_wire.error_payload(exc),
                                                exc.headers if isinstance(exc, http_wire.HttpError) else None))
            self._linger(conn, deadline)
            return "http?"
        if routed.op is None:
            self._send(conn, http_wire.response(200, http_wire.openapi(sorted(self.handlers))))
            return "openapi"
        op, answer = self.call(pid, uid, gid, routed.op, routed.args)
        status = http_wire.status_of(answer)
        self._send(conn, http_wire.response(status, answer["result"] if status == 200 else
                                            {"error": answer["error"]}))
        return op

    def _read_http(self, conn: socket.socket, first: bytes, rest: bytes, deadline: float) -> tuple[http_wire.Head, bytes]:
        """The head (request line and headers, at most ``MAX_HEAD_BYTES`` however it arrives) and a
        body of Content-Length bytes, within the limits."""
        buf = bytearray(first + rest)
        while (end := http_wire.head_length(bytes(buf))) is None:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = conn.recv(65536)
            if not chunk:
                raise http_wire.HttpError(400, "the request ended before its headers did")
            buf += chunk
        head = http_wire.parse_head(bytes(buf[:end]))
        length = head.content_length
        if length > self.limits.max_request_bytes:
            raise RequestTooLarge(f"request body too large ({length} bytes; at most "
                                  f"{self.limits.max_request_bytes // (1024 * 1024)} MiB)",
                                  hint="keep job scripts under 1 MiB; put large inputs in files")
        body = bytearray(buf[end:])
        if len(body) < length and head.headers.get("expect", "").lower() == "100-continue":
            self._send(conn, b"HTTP/1.1 100 Continue\r\n\r\n")
        while len(body) < length:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = conn.recv(min(65536, length - len(body)))
            if not chunk:
                raise http_wire.HttpError(400, f"the body ended after {len(body)} of its {length} bytes")
            body += chunk
        return head, bytes(body[:length])

    def _send(self, conn: socket.socket, data: bytes) -> None:
        try:
            conn.settimeout(self.limits.write_timeout_s)
            conn.sendall(data)
        except OSError as exc:
            log.info("could not deliver an answer: %s", exc)

    def _linger(self, conn: socket.socket, deadline: float) -> None:
        """After refusing a request not read to its end: say no more and read what the client still
        sends (a second at most, within the drain bound), so closing does not reset the connection
        before the client has read the answer (RFC 9112 9.6)."""
        try:
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            return
        until, budget = min(deadline, time.monotonic() + 1.0), self.limits.drain_max_bytes
        while budget > 0 and time.monotonic() < until:
            conn.settimeout(max(0.01, until - time.monotonic()))
            try:
                chunk = conn.recv(min(65536, budget))
            except OSError:
                return
            if not chunk:
                return
            budget -= len(chunk)

    @staticmethod
    def _drain(conn: socket.socket, deadline: float, budget: int) -> None:
        while budget > 0 and time.monotonic() < deadline:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = conn.recv(min(65536, budget))
            except OSError:
                return
            if not chunk or b"\n" in chunk:
                return
            budget -= len(chunk)

    def _write(self, conn: socket.socket, answer: dict[str, Any]) -> None:
        try:
            conn.settimeout(self.limits.write_timeout_s)
            conn.sendall((json.dumps(answer, default=str) + "\n").encode())
        except OSError as exc:
            log.info("could not deliver an answer: %s", exc)

    def _reply_now(self, conn: socket.socket, exc: BrokerError) -> None:
        try:
            conn.settimeout(0.2)
            conn.sendall((json.dumps(_error(exc)) + "\n").encode())
        except OSError:
            pass
        finally:
            conn.close()

    def dispatch(self, pid: int, uid: int, gid: int, line: bytes) -> tuple[str, dict[str, Any]]:
        """(op name, answer) for one request line."""
        try:
            msg = json.loads(line)
            op = msg["op"]
            args = msg.get("args") or {}
            if not isinstance(args, dict) or not isinstance(op, str):
                raise ValueError
        except RecursionError:
            return "?", _error(BrokerError("malformed request: nested too deeply",
                                           hint="use the gbroker command-line client"))
        except (ValueError, KeyError, TypeError):
            return "?", _error(BrokerError("malformed request", hint="use the gbroker command-line client"))
        return self.call(pid, uid, gid, op, args)

    def call(self, pid: int, uid: int, gid: int, op: str, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """(op name, answer) for one operation, as the kernel-named caller."""
        handler = self.handlers.get(op)
        if handler is None:
            return op, _error(
                BrokerError(f"unknown operation {op[:64]!r}", hint="client and daemon versions may differ")
            )
        try:
            caller = caller_from_ids(pid, uid, gid, self.admin_group)
            return op, {"ok": True, "result": handler(caller, args)}
        except BrokerError as exc:
            return op, _error(exc)
        except Exception as exc:  # a bug: tell the client, keep serving
            log.exception("handler %s failed for uid %s", op, uid)
            return op, _error(_internal(exc, op))

    # -- life cycle ------------------------------------------------------------
    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="gbroker-accept", daemon=True)
        thread.start()
        return thread

    def shutdown(self) -> None:
        """Stop accepting, drop waiting connections, and wait for the requests in progress."""
        self._stop.set()
        self._stopped.wait(5)
        with self._lock:
            waiting = [c for q in self._waiting.values() for c, _, _ in q]
            self._waiting.clear()
        for conn in waiting:
            conn.close()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def server_close(self) -> None:
        self.socket.close()
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


def _internal(exc: Exception, op: str = "the request") -> BrokerError:
    """What a client is told of a bug (HTTP reads "internal error" as 500)."""
    return BrokerError(f"internal error in {op}: {exc}", hint="see the daemon log")


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
