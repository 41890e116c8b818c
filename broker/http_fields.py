"""The numbers and framing fields of an HTTP request, read one way for every server of the daemon.

Both HTTP servers (``broker.http_wire`` on the UNIX socket, ``broker.ops.listener``
on loopback TCP) and the dashboard read numbers a client wrote: Content-Length,
a job id in a path, ``?limit=``, ``?page=``. Python's ``str.isdigit()`` accepts
``²`` and ``٣``, and ``int()`` reads ``٣`` as 3 and refuses ``²`` with a
ValueError no handler expected (the request then got no answer at all). So a
number here is ASCII digits only, and not so many of them that the database
could not hold it; anything else is an ``HttpError`` with its 400 and a message
saying what was wrong.

Content-Length follows RFC 9112 6.3: a request whose length is unclear is
refused, never guessed at (two different lengths, or a length next to a
Transfer-Encoding, is how a request is smuggled past a proxy that reads it
the other way).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from broker.errors import BrokerError

MAX_HEAD_BYTES = 64 * 1024
"""A request's line and headers together, on every server of the daemon: one byte more is answered 431."""
MAX_DIGITS = 18
"""Any 18-digit number fits a signed 64-bit column (job ids, limits, lengths)."""


class HttpError(BrokerError):
    """A request HTTP itself refuses (malformed, unknown route, wrong method, a bad number)."""

    exit_code = 2

    def __init__(self, status: int, message: str, hint: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message, hint=hint)
        self.status = status
        self.headers = dict(headers or {})


def ascii_digits(raw: str, max_digits: int = MAX_DIGITS) -> int | None:
    """``raw`` as a whole number when it is 1 to ``max_digits`` ASCII digits, else None."""
    if not 0 < len(raw) <= max_digits or not raw.isascii() or not raw.isdigit():
        return None
    return int(raw)


def whole_number(raw: str, what: str, max_digits: int = MAX_DIGITS) -> int:
    """``raw`` as a whole number, or a 400 that names ``what`` was wrong (and shows it, cut short)."""
    value = ascii_digits(raw, max_digits)
    if value is None:
        raise HttpError(400, f"{what} {raw[:20]!r} is not a whole number",
                        hint=f"write it in the digits 0-9, at most {max_digits} of them")
    return value


def content_length(values: Sequence[str], transfer_encoding: bool) -> int:
    """The body's length from every Content-Length a request sent (each header, each comma-separated
    value); 0 without one. Refused: a value that is not a number, values that differ, and a
    Transfer-Encoding (with a Content-Length: 400, the framing is ambiguous; alone: 411, chunked
    bodies are not read)."""
    parts = [p.strip() for v in values for p in v.split(",")]
    if transfer_encoding:
        if parts:
            raise HttpError(400, "the request has both Transfer-Encoding and Content-Length",
                            hint="send one of them (RFC 9112 6.3): a Content-Length alone")
        raise HttpError(411, "chunked request bodies are not accepted",
                        hint="send the body with a Content-Length (curl --data does)")
    lengths = {whole_number(p, "Content-Length") for p in parts}
    if len(lengths) > 1:
        raise HttpError(400, f"the request has {len(lengths)} different Content-Lengths",
                        hint="send one Content-Length (RFC 9112 6.3)")
    return lengths.pop() if lengths else 0
