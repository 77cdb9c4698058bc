"""multiprocessing Pipe messages without Connection's per-call overhead: the engine process's step messages
(verifier_service/engine_process.py) and the drafter link's both ways (drafter_service/link.py).

`pickled(message)` is what `Connection.send` writes, for `send_bytes`, without the pickler object and buffer that
`send` builds for every message (2.6-3.6 against 0.6-1.0 us a step message, warm). `PipeReader` reads the messages:
`Connection.poll(0)` builds a selector and polls, and each `recv()` reads a header and a body, seven system calls and
~60 us on the engine thread to collect a step's two drafter answers (tools/link_rhythm.py); here one non-blocking
`recv` takes every byte the peer has written, and the frames (multiprocessing's: a 4-byte big-endian length, or -1
and an 8-byte one, then the pickle) are cut from that. The Connection still sends, and nothing else reads it.
"""
from __future__ import annotations

import os
import pickle
import select
import socket
import struct

_LENGTH, _LONG_LENGTH = struct.Struct("!i"), struct.Struct("!Q")
_CHUNK = 1 << 16  # under malloc's mmap threshold: no mapping made and dropped per read


def pickled(message) -> bytes:
    """The bytes Connection.send(message) writes (its receiver's recv() reads them), for Connection.send_bytes."""
    return pickle.dumps(message, pickle.HIGHEST_PROTOCOL)


class PipeReader:
    """The messages a Connection's peer has sent, without blocking (`available`) or waiting up to a timeout (`wait`).
    Raises EOFError once the peer has closed its end and every whole message has been read."""

    def __init__(self, connection) -> None:
        # A second socket object on the same file description: MSG_DONTWAIT makes one recv non-blocking without
        # changing the blocking mode that the Connection's sends rely on.
        self._socket = socket.socket(fileno=os.dup(connection.fileno()))
        self._poll = select.poll()
        self._poll.register(self._socket, select.POLLIN)
        self._buffer = bytearray()
        self._closed = False

    def available(self) -> list:
        """Every whole message already written, oldest first ([] when none is)."""
        while not self._closed:
            try:
                chunk = self._socket.recv(_CHUNK, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            if not chunk:  # the peer closed: what came before still counts
                self._closed = True
                break
            self._buffer += chunk
            if len(chunk) < _CHUNK:
                break
        messages = self._messages()
        if self._closed and not messages:
            if self._buffer:
                raise OSError("the pipe closed in the middle of a message")
            raise EOFError
        return messages

    def wait(self, timeout_s: float) -> bool:
        """Whether bytes came (or the peer closed) within timeout_s."""
        return bool(self._poll.poll(max(timeout_s, 0.0) * 1000.0))

    def close(self) -> None:
        self._socket.close()

    def _messages(self) -> list:
        messages, buffer, start = [], self._buffer, 0
        while len(buffer) - start >= _LENGTH.size:
            size, = _LENGTH.unpack_from(buffer, start)
            header = _LENGTH.size
            if size == -1:
                if len(buffer) - start < header + _LONG_LENGTH.size:
                    break
                size, = _LONG_LENGTH.unpack_from(buffer, start + header)
                header += _LONG_LENGTH.size
            if len(buffer) - start - header < size:
                break
            body = start + header
            messages.append(pickle.loads(buffer[body:body + size]))
            start = body + size
        del buffer[:start]
        return messages
