"""Shared captions across replicas behind a load balancer of your own (nginx): the `share_peers` setting.

A viewer of `/watch/TOKEN/` may reach another replica than the speaker's. A replica that has no feed of that
token asks its peers for it (`share_peers`: the other replicas' HOST:PORT; a name that resolves to several
addresses, as a compose service's name does, means each of them) and follows the first one's feed
(`PeerRelays`): one connection to the peer a feed, however many of this replica's viewers watch it, its events
handed to them as a local feed's are. A relayed request carries RELAY_HEADER, and a replica answers it from its
own feeds only: a request is relayed once, never in a loop. (Ray Serve needs none of this: server/ray_shares.py.)

The peer is read with h11 (uvicorn's own HTTP/1.1 parser) over asyncio streams: no client library more.
"""
from __future__ import annotations

import asyncio
import codecs
import json
import re
import socket
from collections.abc import AsyncIterator

import h11

from server.share import NO_FEED, Viewers

RELAY_HEADER = "x-simulserve-relay"
CONNECT_S = 2.0        # a peer that does not answer this fast is skipped
READ_CHUNK = 65536
# watch tokens are url-safe base64 (server/share.py): nothing else goes into a request line to a peer
TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")


class PeerFeed:
    """An open `/watch/TOKEN/events` response of a peer, its status read; `body()` yields the rest."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: h11.Connection):
        self.reader, self.writer, self.conn = reader, writer, conn

    async def body(self) -> AsyncIterator[bytes]:
        try:
            while True:
                event = self.conn.next_event()
                if event is h11.NEED_DATA:
                    self.conn.receive_data(await self.reader.read(READ_CHUNK))
                elif isinstance(event, h11.Data):
                    yield bytes(event.data)
                else:           # EndOfMessage, ConnectionClosed: the peer's feed has ended
                    return
        except (OSError, h11.RemoteProtocolError):
            return
        finally:
            self.close()

    async def events(self) -> AsyncIterator[dict]:
        """The feed's events (server/caption_lines.py sse_text), its keep-alive comments left out, until it ends
        or the connection does; text that is not such an event ends it too."""
        text, decode = "", codecs.getincrementaldecoder("utf-8")().decode
        async for chunk in self.body():
            text += decode(chunk)
            *blocks, text = text.split("\n\n")
            for block in blocks:
                data = [line[5:].lstrip(" ") for line in block.split("\n") if line.startswith("data:")]
                if data:
                    try:
                        event = json.loads("\n".join(data))
                        yield {"lines": [str(x) for x in event["lines"]], "ended": bool(event["ended"])}
                    except (ValueError, KeyError, TypeError):
                        return

    def close(self) -> None:
        self.writer.close()


async def peer_addresses(peers: list[str]) -> list[tuple[str, int]]:
    """Every address the peers name, in order, once each; a name that does not resolve is left out."""
    loop, out = asyncio.get_running_loop(), []
    for peer in peers:
        host, _, port = peer.rpartition(":")
        try:
            infos = await loop.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
        except (OSError, ValueError):
            continue
        for *_, addr in infos:
            if (addr[0], addr[1]) not in out:
                out.append((addr[0], addr[1]))
    return out


async def open_peer_feed(address: tuple[str, int], watch: str) -> PeerFeed | None:
    """The peer's feed of `watch`, its response started (200), or None (no such feed there, or no answer)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(*address), CONNECT_S)
    except (OSError, TimeoutError):
        return None
    conn = h11.Connection(h11.CLIENT)
    host = f"[{address[0]}]" if ":" in address[0] else address[0]
    try:
        writer.write(conn.send(h11.Request(method="GET", target=f"/watch/{watch}/events", headers=[
            ("Host", f"{host}:{address[1]}"), (RELAY_HEADER, "1"), ("Accept", "text/event-stream")])))
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await asyncio.wait_for(reader.read(READ_CHUNK), CONNECT_S)
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Response):
                if event.status_code == 200:
                    return PeerFeed(reader, writer, conn)
            break
    except (OSError, TimeoutError, h11.RemoteProtocolError, h11.LocalProtocolError):
        pass
    writer.close()
    return None


async def find_peer_feed(peers: list[str], watch: str) -> PeerFeed | None:
    """The first peer that has the feed, asked all at once; a slow or silent peer does not hold the viewer up
    once another has answered (its answer, if any, is closed when it comes)."""
    if not TOKEN.fullmatch(watch):
        return None
    pending = {asyncio.create_task(open_peer_feed(a, watch)) for a in await peer_addresses(peers)}
    found = None
    while pending and found is None:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            feed = task.result()
            if feed is not None and found is None:
                found = feed
            elif feed is not None:
                feed.close()
    for task in pending:
        task.add_done_callback(_close_answer)
    return found


def _close_answer(task: asyncio.Task) -> None:
    if not task.cancelled() and task.result() is not None:
        task.result().close()


class Follow:
    """A peer's feed that this replica follows: the open response and its latest event."""

    def __init__(self, feed: PeerFeed, latest: dict):
        self.feed, self.latest = feed, latest


class PeerRelays:
    """The peers' feeds this replica follows for its own viewers (server/app.py, `share_peers`): one connection
    a feed, opened by its first viewer here and closed when its last one goes; its events reach the viewers
    through `viewers` (server/share.py Viewers: the same queues, cap and keep-alives as a local feed's)."""

    def __init__(self, peers: list[str], viewers: Viewers):
        self.peers, self.viewers = peers, viewers
        self.follows: dict[str, Follow] = {}            # watch token -> the feed followed
        self.opening: dict[str, asyncio.Task] = {}      # watch token -> its first viewer's search of the peers
        self.tasks: set[asyncio.Task] = set()
        viewers.on_stop.append(self.stop)

    async def subscribe(self, watch: str) -> asyncio.Queue | str:
        """A viewer's queue, its first event the feed's latest; or why not (NO_FEED, or the viewers' cap)."""
        if watch not in self.follows:
            task = self.opening.get(watch)
            if task is None:             # (viewers who come while it looks wait for the same answer)
                task = self.opening[watch] = asyncio.create_task(self._open(watch))
                task.add_done_callback(lambda _: self.opening.pop(watch, None))
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:   # (the viewer went while it looked: no follow is left unwatched)
                task.add_done_callback(lambda _: self._drop_if_unwatched(watch))
                raise
        follow = self.follows.get(watch)
        if follow is None:
            return NO_FEED
        q = self.viewers.add(watch, follow.latest)
        if q is None:
            self._drop_if_unwatched(watch)
            return self.viewers.full
        return q

    def unsubscribe(self, watch: str, q: asyncio.Queue) -> None:
        self.viewers.remove(watch, q)
        self._drop_if_unwatched(watch)

    async def _open(self, watch: str) -> None:
        feed = await find_peer_feed(self.peers, watch)
        if feed is None:
            return
        events = feed.events()
        try:            # (a peer's response starts with the feed's latest event)
            first = await asyncio.wait_for(anext(events), CONNECT_S)
        except (StopAsyncIteration, TimeoutError):
            feed.close()
            return
        if self.viewers.stopped:
            feed.close()
            return
        follow = self.follows[watch] = Follow(feed, first)
        task = asyncio.create_task(self._follow(watch, follow, events))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _follow(self, watch: str, follow: Follow, events: AsyncIterator[dict]) -> None:
        ended = False
        try:
            async for event in events:
                follow.latest = event
                self.viewers.deliver(watch, event)
                if event["ended"]:
                    ended = True
                    return
        finally:
            follow.feed.close()
            if self.follows.get(watch) is follow:
                del self.follows[watch]
                if not ended:      # the peer went away mid-feed: the viewers' pages reconnect and look again
                    self.viewers.close(watch)

    def stop(self) -> None:
        """The server stops: every followed feed is closed (its follower ends its viewers' responses)."""
        for follow in self.follows.values():
            follow.feed.close()

    def _drop_if_unwatched(self, watch: str) -> None:
        if watch in self.follows and watch not in self.viewers.by_watch:
            self.follows.pop(watch).feed.close()     # (its follower's read ends)
