"""Who is at the other end of a TCP connection to the ops listener, as the kernel says.

Every local client of a loopback listener is 127.0.0.1 (or ::1), so an address
says nothing about who connected. The kernel does know: the client's own
socket, on this host, has an owner uid. The sock_diag netlink interface
(``NETLINK_SOCK_DIAG``, ``SOCK_DIAG_BY_FAMILY``, the INET_DIAG request that
``ss`` uses) looks one socket up by its four addresses and ports, an exact
lookup with one small request and one small answer, whatever the number of
sockets on the host. Nothing the client writes is read; a client cannot name
another user's socket, as the four-tuple of a connection is the kernel's.

A peer the kernel does not find on this host (a remote client, a client gone
before the lookup) is known by its address only (``Peer.uid`` None). A
time-wait or half-open socket reports uid 0 in sock_diag; such answers are
not taken as root's.
"""

from __future__ import annotations

import ipaddress
import itertools
import logging
import socket
import struct
from dataclasses import dataclass

log = logging.getLogger(__name__)

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
INET_DIAG_NOCOOKIE = 0xFFFFFFFF
_FULL_SOCKET_STATES = frozenset(range(1, 12)) - {6}
"""TCP states of a full socket (1 ESTABLISHED .. 11 CLOSING); not 6 TIME_WAIT, 12 NEW_SYN_RECV (uid 0)."""
_NLMSG = struct.Struct("=IHHII")
_REQ = struct.Struct("=BBBBI")
_MSG_HEAD = struct.Struct("=BBBB")
_MSG_TAIL = struct.Struct("=IIIII")
"""expires, rqueue, wqueue, uid, inode: after the 48-byte socket id."""
_SOCKID_LEN = 48
_seq = itertools.count(1)
_warned: list[bool] = []
"""Whether the lookup's failure was logged (once a process, not once a connection)."""


@dataclass(frozen=True)
class Peer:
    address: str
    uid: int | None
    """The owner of the client's socket when it is on this host, else None."""

    @property
    def key(self) -> str:
        """What the listener counts connections by: the user when known, else the address."""
        return f"uid {self.uid}" if self.uid is not None else f"address {self.address}"


def peer_of(conn: socket.socket) -> Peer:
    """The peer of an accepted TCP connection; its uid from the kernel when it is local."""
    try:
        local, remote = conn.getsockname(), conn.getpeername()
    except OSError:
        return Peer("?", None)
    address = str(remote[0])
    try:
        uid = socket_owner(address, int(remote[1]), str(local[0]), int(local[1]))
    except OSError as exc:  # no sock_diag (a kernel without inet_diag, a sandbox): by address
        if not _warned:
            _warned.append(True)
            log.warning("cannot learn the uid of a connection to the ops listener from the kernel (sock_diag: "
                        "%s): local clients share one count by address", exc)
        uid = None
    return Peer(address, uid)


def socket_owner(src: str, sport: int, dst: str, dport: int) -> int | None:
    """The uid owning the TCP socket bound to ``src:sport`` and connected to ``dst:dport`` on this
    host, or None when there is none (or it is not a full socket)."""
    family, src_b, dst_b = _addresses(src, dst)
    request = _request(family, src_b, sport, dst_b, dport)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)
        nl.sendto(request, (0, 0))
        return _owner_from(nl.recv(8192))


def _addresses(src: str, dst: str) -> tuple[int, bytes, bytes]:
    """The family to ask in and both addresses packed; an IPv4 peer of an IPv6 socket is IPv4."""
    a, b = ipaddress.ip_address(src), ipaddress.ip_address(dst)
    if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None:
        a = a.ipv4_mapped
    if isinstance(b, ipaddress.IPv6Address) and b.ipv4_mapped is not None:
        b = b.ipv4_mapped
    family = socket.AF_INET if a.version == 4 else socket.AF_INET6
    return family, a.packed.ljust(16, b"\0"), b.packed.ljust(16, b"\0")


def _request(family: int, src: bytes, sport: int, dst: bytes, dport: int) -> bytes:
    """An INET_DIAG request (``inet_diag_req_v2``) for one socket, found by its id, any state."""
    sockid = struct.pack("!HH", sport, dport) + src + dst + struct.pack("=III", 0, INET_DIAG_NOCOOKIE,
                                                                          INET_DIAG_NOCOOKIE)
    body = _REQ.pack(family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    return _NLMSG.pack(_NLMSG.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, next(_seq), 0) + body


def _owner_from(reply: bytes) -> int | None:
    """The uid in a sock_diag answer (``inet_diag_msg``); None for an error answer (no such socket)."""
    if len(reply) < _NLMSG.size:
        return None
    _, kind, _, _, _ = _NLMSG.unpack_from(reply)
    body = reply[_NLMSG.size:]
    if kind == NLMSG_ERROR:
        return None  # ENOENT: no socket on this host has that id
    if kind != SOCK_DIAG_BY_FAMILY or len(body) < _MSG_HEAD.size + _SOCKID_LEN + _MSG_TAIL.size:
        return None
    _, state, _, _ = _MSG_HEAD.unpack_from(body)
    if state not in _FULL_SOCKET_STATES:
        return None
    _, _, _, uid, _ = _MSG_TAIL.unpack_from(body, _MSG_HEAD.size + _SOCKID_LEN)
    return int(uid)
