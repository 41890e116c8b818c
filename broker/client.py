"""The socket client the CLI uses. Standard library only (the CLI must start fast).

Wire format: one JSON object per line. Request ``{"op": NAME, "args": {...}}``;
answer ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": {...}}``.
The daemon learns who is calling from the kernel (SO_PEERCRED), so the request
carries no identity.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from broker.errors import BrokerError, DaemonUnavailable

MAX_MESSAGE_BYTES = 8 * 1024 * 1024
DEFAULT_TIMEOUT_SECONDS = 60.0


class RemoteError(BrokerError):
    """An error the daemon reported; keeps the daemon's exit code."""

    def __init__(self, kind: str, message: str, hint: str, exit_code: int) -> None:
        super().__init__(message, hint=hint or None)
        self.kind = kind
        self.exit_code = exit_code


def call(socket_path: str, op: str, timeout: float = DEFAULT_TIMEOUT_SECONDS, **args: Any) -> Any:
    """Send one request to the daemon and return its result (or raise its error)."""
    payload = (json.dumps({"op": op, "args": args}) + "\n").encode()
    if len(payload) > MAX_MESSAGE_BYTES:
        raise BrokerError(
            f"request too large ({len(payload)} bytes)",
            hint="keep job scripts under 1 MiB; put large inputs in files",
        )
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(socket_path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise DaemonUnavailable(
                f"the gbroker daemon is not running (no answer on {socket_path}: {exc.strerror})",
                hint="start it with `gbroker daemon` (or `systemctl start gbroker`), "
                "or point --socket / GBROKER_SOCKET at the right socket. Nothing was submitted.",
            ) from None
        except PermissionError:
            raise DaemonUnavailable(
                f"no permission to connect to {socket_path}",
                hint="ask an admin to make the socket world-connectable (mode 0666)",
            ) from None
        sock.sendall(payload)
        reply = _read_line(sock)
    except TimeoutError:
        raise DaemonUnavailable(
            f"the gbroker daemon did not answer within {timeout:.0f} s",
            hint="check `journalctl -u gbroker` or the daemon's log; the request may still complete "
            "— run `gbroker status` before submitting again",
        ) from None
    finally:
        sock.close()
    try:
        msg = json.loads(reply)
    except json.JSONDecodeError:
        raise DaemonUnavailable("the daemon sent a malformed answer", hint="check the daemon log") from None
    if msg.get("ok"):
        return msg.get("result")
    err = msg.get("error") or {}
    raise RemoteError(
        err.get("type", "BrokerError"),
        err.get("message", "unknown error"),
        err.get("hint", ""),
        int(err.get("exit_code", 1)),
    )


def _read_line(sock: socket.socket) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if chunk.endswith(b"\n") or size > MAX_MESSAGE_BYTES:
            break
    if not chunks:
        raise DaemonUnavailable(
            "the daemon closed the connection without answering",
            hint="check the daemon log; it may be stopping",
        )
    return b"".join(chunks)
