"""The socket client the CLI uses. Standard library only (the CLI must start fast).

Wire format: one JSON object per line. Request ``{"op": NAME, "args": {...}}``;
answer ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": {...}}``.
The daemon learns who is calling from the kernel (SO_PEERCRED), so the request
carries no identity.

Two kinds of retry, both safe:

* a "busy" answer (the daemon serves as many of this user's requests as it
  allows) is retried for any request: it was not looked at;
* a lost answer (the connection closed, or the daemon restarted, after the
  request was sent) is retried only for requests that are safe to repeat:
  reads, and a submission, which carries its own idempotency key, so the
  repeat returns the job the first one made instead of a second job.
"""

from __future__ import annotations

import json
import random
import socket
import time
from typing import Any

from broker.errors import BrokerError, DaemonUnavailable

MAX_MESSAGE_BYTES = 2 * 1024 * 1024
"""The daemon's limit on one request (a job script is at most 1 MiB)."""
DEFAULT_TIMEOUT_SECONDS = 60.0
BUSY_RETRY_SECONDS = 30.0
"""How long a "busy" daemon is retried."""
LOST_ANSWER_RETRY_SECONDS = 90.0
"""How long a request that is safe to repeat is retried after its answer was lost."""


class RemoteError(BrokerError):
    """An error the daemon reported; keeps the daemon's exit code."""

    def __init__(self, kind: str, message: str, hint: str, exit_code: int) -> None:
        super().__init__(message, hint=hint or None)
        self.kind = kind
        self.exit_code = exit_code


class _LostAnswer(Exception):
    """The request was sent (or may have been); no answer came back."""


def call(
    socket_path: str,
    op: str,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    *,
    repeatable: bool = False,
    **args: Any,
) -> Any:
    """Send one request to the daemon and return its result (or raise its error).

    ``repeatable``: the request may be sent again when its answer was lost
    (reads; submissions with an idempotency key).
    """
    payload = (json.dumps({"op": op, "args": args}) + "\n").encode()
    if len(payload) > MAX_MESSAGE_BYTES:
        raise BrokerError(
            f"request too large ({len(payload)} bytes, at most {MAX_MESSAGE_BYTES})",
            hint="keep job scripts under 1 MiB; put large inputs in files",
        )
    start = time.monotonic()
    pause = 0.05
    sent_once = False
    while True:
        try:
            msg = _exchange(socket_path, payload, timeout, sent_once)
        except _LostAnswer as lost:
            sent_once = True
            if not repeatable or time.monotonic() - start > LOST_ANSWER_RETRY_SECONDS:
                raise DaemonUnavailable(
                    f"the gbroker daemon did not answer ({lost})",
                    hint="check `journalctl -u gbroker` or the daemon's log; the request may still "
                    "complete — run `gbroker status` before trying again",
                ) from None
        else:
            if msg.get("ok"):
                return msg.get("result")
            err = msg.get("error") or {}
            if err.get("type") != "Busy" or time.monotonic() - start > BUSY_RETRY_SECONDS:
                raise RemoteError(
                    err.get("type", "BrokerError"),
                    err.get("message", "unknown error"),
                    err.get("hint", ""),
                    int(err.get("exit_code", 1)),
                )
        time.sleep(pause * (0.5 + random.random()))
        pause = min(pause * 2, 2.0)


def _exchange(socket_path: str, payload: bytes, timeout: float, sent_before: bool) -> dict[str, Any]:
    """One connection: send, read the answer line. _LostAnswer once the request may have left."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(socket_path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            if sent_before:
                raise _LostAnswer(f"no daemon on {socket_path} after a restart") from None
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
        try:
            sock.sendall(payload)
            reply = _read_line(sock)
        except TimeoutError:
            raise _LostAnswer(f"no answer within {timeout:.0f} s") from None
        except OSError as exc:
            raise _LostAnswer(f"connection lost: {exc.strerror or exc}") from None
    finally:
        sock.close()
    if not reply:
        raise _LostAnswer("it closed the connection without answering")
    try:
        msg = json.loads(reply)
    except json.JSONDecodeError:
        raise DaemonUnavailable("the daemon sent a malformed answer", hint="check the daemon log") from None
    if not isinstance(msg, dict):
        raise DaemonUnavailable("the daemon sent a malformed answer", hint="check the daemon log")
    return msg


def _read_line(sock: socket.socket) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if chunk.endswith(b"\n") or size > 64 * MAX_MESSAGE_BYTES:
            break
    return b"".join(chunks)
