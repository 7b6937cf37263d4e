"""The link between a front end and the engine process of `simulserve serve --workers N`: batches of typed
messages (server/ipc_messages.py), pickled, over a Unix socket, on each side's event loop.

    frame = 4-byte length (big-endian) + pickle.dumps([message, ...])

Everything one side sends during one pass of its event loop goes out as one frame, one pickle and one write:
a job's events for every stream of one front end, the commands one front end's websockets brought in.
Unpickling runs code, so before anything is unpickled each side proves it holds the key the parent process
gave both (an HMAC challenge each way); the socket also lies in a directory only its user may enter.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import logging
import os
import pickle
import struct
from typing import Any, Callable

from server.ipc_messages import Reply

log = logging.getLogger("simulserve.ipc")
HEADER = struct.Struct("!I")
NONCE = 32
HANDSHAKE_S = 10.0


class LinkClosed(ConnectionError):
    """The process at the other end has gone."""


def _proof(key: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(key, role + nonce, hashlib.sha256).digest()


async def accept_link(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: bytes) -> Link:
    """The engine process's side of a new connection: challenge the front end, then answer its challenge."""
    nonce = os.urandom(NONCE)
    writer.write(nonce)
    got = await asyncio.wait_for(reader.readexactly(2 * NONCE), HANDSHAKE_S)
    if not hmac.compare_digest(got[:NONCE], _proof(key, b"front", nonce)):
        writer.close()
        raise PermissionError("a process without the key tried to connect")
    writer.write(_proof(key, b"engine", got[NONCE:]))
    return Link(reader, writer)


async def open_link(path: str, key: bytes) -> Link:
    """A front end's connection to the engine process."""
    reader, writer = await asyncio.open_unix_connection(path)
    nonce = await asyncio.wait_for(reader.readexactly(NONCE), HANDSHAKE_S)
    mine = os.urandom(NONCE)
    writer.write(_proof(key, b"front", nonce) + mine)
    answer = await asyncio.wait_for(reader.readexactly(NONCE), HANDSHAKE_S)
    if not hmac.compare_digest(answer, _proof(key, b"engine", mine)):
        writer.close()
        raise PermissionError("the engine socket answered without the key")
    return Link(reader, writer)


class Link:
    """One connection: `send` (batched per loop pass), `call` (a request and its Reply), `serve` (the reader)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.loop = asyncio.get_running_loop()
        self.closed = False
        self._out: list = []
        self._calls: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)

    def send(self, msg) -> None:
        if self.closed:
            return
        if not self._out:
            self.loop.call_soon(self._flush)
        self._out.append(msg)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if out and not self.closed:
            data = pickle.dumps(out, pickle.HIGHEST_PROTOCOL)
            self.writer.write(HEADER.pack(len(data)) + data)

    async def call(self, make: Callable[[int], Any]) -> Any:
        """Send make(request number) and wait for its Reply's value; LinkClosed if the other end goes."""
        if self.closed:
            raise LinkClosed("the other process has gone")
        req = next(self._ids)
        fut = self.loop.create_future()
        self._calls[req] = fut
        self.send(make(req))
        try:
            return await fut
        finally:
            self._calls.pop(req, None)

    async def serve(self, handle: Callable[[Any], None]) -> None:
        """Read until the other end goes: replies to their callers, every other message to handle()."""
        try:
            while True:
                (n,) = HEADER.unpack(await self.reader.readexactly(HEADER.size))
                for msg in pickle.loads(await self.reader.readexactly(n)):
                    if type(msg) is Reply:
                        fut = self._calls.get(msg.req)
                        if fut is not None and not fut.done():
                            fut.set_result(msg.value)
                        continue
                    try:
                        handle(msg)
                    except Exception:  # noqa: BLE001 - one message's fault must not cut the link
                        log.exception("handling %s failed", type(msg).__name__)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self._flush()
        self.closed = True
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(LinkClosed("the other process has gone"))
        self.writer.close()
