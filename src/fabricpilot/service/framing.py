"""Length-prefixed pickles over a socket: how the service's processes talk to each other.

Each message is an 8-byte big-endian length followed by a pickle of that length. The
processes at both ends are ours (spawned by the service, connected by a socket pair), so
pickles are safe here; nothing listening on a network speaks this.
"""

from __future__ import annotations

import pickle
import socket
import struct
from collections.abc import Iterator
from typing import Any, BinaryIO

__all__ = ["HEADER", "frame", "messages", "recv", "send"]

HEADER = struct.Struct("!Q")


def frame(obj: Any) -> bytes:
    """``obj`` as one message.

    >>> len(frame("a")) == HEADER.size + len(pickle.dumps("a", pickle.HIGHEST_PROTOCOL))
    True
    """
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


def send(sock: socket.socket, obj: Any) -> None:
    """Send ``obj`` as one message."""
    sock.sendall(frame(obj))


def messages(buf: bytearray) -> Iterator[Any]:
    """The complete messages at the start of ``buf``, each removed from it once read (a
    partial one stays for the next bytes).

    >>> buf = bytearray(frame("a") + frame("b")[:5])  # one message and the start of one
    >>> list(messages(buf)), bytes(buf) == frame("b")[:5]
    (['a'], True)
    """
    pos = 0
    try:
        while len(buf) - pos >= HEADER.size:
            (n,) = HEADER.unpack_from(buf, pos)
            end = pos + HEADER.size + n
            if len(buf) < end:
                break
            msg = pickle.loads(memoryview(buf)[pos + HEADER.size:end])
            pos = end
            yield msg
    finally:
        del buf[:pos]


def recv(stream: BinaryIO) -> Any:
    """The next message read from ``stream``, or ``None`` once the other side has gone.

    >>> import io
    >>> recv(io.BytesIO(frame({"x": 1}))), recv(io.BytesIO(frame(1)[:-1]))
    ({'x': 1}, None)
    """
    head = stream.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    (n,) = HEADER.unpack(head)
    data = stream.read(n)
    if len(data) < n:
        return None
    return pickle.loads(data)
