"""Shared captions: a stream's live translation shown to viewers (`start` with `share`; docs/server.md#shared-captions).

A talk's captions are wanted on the audience's screens. A stream opened with `"share": true` gets, in `ready`,
a watch token (for viewers: `GET /watch/TOKEN/` is a full-screen caption page, `/watch/TOKEN/events` its
Server-Sent Events feed) and a share key (for the speaker only: a stream started again with `"share": KEY`
after a lost connection carries on the same feed, so the viewers' link stays the same). Viewers only read.

`ShareHub` holds every feed of the server and computes what viewers see: the last two caption lines, as the
subtitles roll up (server/caption_lines.py), one event per word, `{"lines": [...], "ended": false}`. It lives
where every stream's words pass: in the server's one process, or with `--workers`/`--engines` in the primary engine
process, which the front ends tell each word of a shared stream and ask for the feeds their viewers want
(server/frontend.py). A feed ends with its stream's `end`; a speaker who goes away without it has
`share_grace_s` seconds to come back with the key before the viewers are told the feed has ended. The limits
are settings (server/settings.py: `max_viewers`, 0 turns sharing off; `share_grace_s`).
"""
from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from server.caption_lines import KEEPALIVE_TEXT, CaptionLines, sse_text
from server.ipc_messages import ShareLeft, ShareOpen, ShareSentence, ShareWord, Unwatch, Watch

EXPIRE_EVERY_S = 5.0       # how often the feeds past their grace time are ended
KEEPALIVE_S = 15.0         # an SSE comment this often keeps proxies from closing an idle feed
VIEWER_QUEUE = 1000        # events a viewer may lag behind before it is dropped (its page reconnects)


NO_FEED = "no such caption feed, or it has ended"
NO_SHARING = "this server does not share captions (its max_viewers is 0)"


class ShareError(Exception):
    """A `share` in `start` that cannot be served (becomes `bad_setting`)."""


@dataclass
class Feed:
    watch: str
    lines: CaptionLines = field(default_factory=CaptionLines)
    base: int = 0              # the feed's number of the current speaker stream's sentence 0
    finished: int = 0          # the feed's sentences finished so far (their `sentence` message came)
    live: bool = True          # a speaker stream carries it now
    left_at: float | None = None   # when its speaker went away without `end`
    last: dict = field(default_factory=lambda: {"lines": [], "ended": False})


class ShareHub:
    """Every feed of the server. `emit(watch, event)` takes each event for the feed's viewers."""

    def __init__(self, emit: Callable[[str, dict], None], grace_s: float, gauge=None):
        self.emit, self.grace_s, self.gauge = emit, grace_s, gauge
        self.feeds: dict[str, Feed] = {}       # share key -> feed
        self.keys: dict[str, str] = {}         # watch token -> share key

    def open(self, key: str | None) -> tuple[str, str]:
        """A new feed (`key` None) or the feed of `key` carried on by a new speaker stream: (key, watch)."""
        if key is None:
            key, watch = secrets.token_urlsafe(18), secrets.token_urlsafe(12)
            self.feeds[key], self.keys[watch] = Feed(watch), key
            self._count()
            return key, watch
        feed = self.feeds.get(key)
        if feed is None:
            raise ShareError("unknown share key, or its feed has ended (a speaker gone without `end` may come "
                             f"back within {self.grace_s:g} s)")
        if feed.live:
            raise ShareError("this share key's feed is carried by a stream that is still open")
        # the new stream sends the unfinished sentences again from their first word (as clients do after a
        # reconnect): their words leave the lines, and its sentence 0 is the feed's first unfinished one
        feed.lines.restart(feed.finished)
        feed.base, feed.live, feed.left_at = feed.finished, True, None
        self._send(feed, feed.lines.shown())
        return key, feed.watch

    def adopt(self, key: str, watch: str) -> bool:
        """A feed that another hub held (one that was lost: server/ray_shares.py), carried on here under the same
        key and watch token by the stream that carries it; its lines start again from the next word."""
        if key in self.feeds or watch in self.keys:
            return False
        self.feeds[key], self.keys[watch] = Feed(watch), key
        self._count()
        return True

    def word(self, key: str, sentence: int, text: str) -> None:
        feed = self.feeds.get(key)
        if feed is not None:
            feed.lines.add(feed.base + sentence, text)
            self._send(feed, feed.lines.shown())

    def sentence(self, key: str, sentence: int) -> None:
        feed = self.feeds.get(key)
        if feed is not None:
            feed.finished = max(feed.finished, feed.base + sentence + 1)

    def left(self, key: str, ended: bool, now: float | None = None) -> None:
        """The speaker stream is gone: with its `end` (`ended`) the feed ends now, else after the grace time."""
        feed = self.feeds.get(key)
        if feed is None:
            return
        if ended:
            self._end(key)
        else:
            feed.live, feed.left_at = False, time.monotonic() if now is None else now

    def expire(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for key, feed in list(self.feeds.items()):
            if feed.left_at is not None and now - feed.left_at >= self.grace_s:
                self._end(key)

    async def expire_forever(self, also: Callable[[], None] | None = None) -> None:
        """Every EXPIRE_EVERY_S, end the feeds past their grace time (and run `also`)."""
        while True:
            await asyncio.sleep(EXPIRE_EVERY_S)
            self.expire()
            if also is not None:
                also()

    def last(self, watch: str) -> dict | None:
        """The feed's latest event (what a viewer who joins now sees first), or None: no such feed."""
        key = self.keys.get(watch)
        return None if key is None else self.feeds[key].last

    def _send(self, feed: Feed, lines: list[str], ended: bool = False) -> None:
        feed.last = {"lines": lines, "ended": ended}
        self.emit(feed.watch, feed.last)

    def _end(self, key: str) -> None:
        feed = self.feeds.pop(key)
        del self.keys[feed.watch]
        self._count()
        self._send(feed, feed.last["lines"], ended=True)

    def _count(self) -> None:
        if self.gauge is not None:
            self.gauge.set(len(self.feeds))


def sse(event: dict) -> tuple[str, bool]:
    """An event as a viewer's queue holds it: its Server-Sent Events text (made once for all its viewers), and
    whether it is the feed's last."""
    return sse_text(event), event["ended"]


KEEPALIVE = (KEEPALIVE_TEXT, False)


class Viewers:
    """The viewers this process serves, by watch token: a bounded queue each, of `sse` items; `None` in a queue
    closes it. One ticker keeps every response alive (`keep_alive_forever`): a timer per viewer and event
    (`wait_for` on each queue read) cost more than the event's delivery itself at a thousand viewers."""

    def __init__(self, most: int, gauge=None) -> None:
        self.by_watch: dict[str, set[asyncio.Queue]] = {}
        self.count = 0
        self.most = most                     # max_viewers
        self.full = f"this server process serves at most {most} viewers"
        self.on_stop: list[Callable[[], None]] = []   # run when the server stops (share_relay.PeerRelays.stop)
        self.stopped = False
        self.gauge = gauge                   # simulserve_viewers

    def _counted(self, change: int) -> None:
        self.count += change
        if self.gauge is not None:
            self.gauge.set(self.count)

    def add(self, watch: str, first: dict) -> asyncio.Queue | None:
        if self.stopped or self.count >= self.most:
            return None
        q: asyncio.Queue = asyncio.Queue(VIEWER_QUEUE)
        q.put_nowait(sse(first))
        self.by_watch.setdefault(watch, set()).add(q)
        self._counted(1)
        return q

    def remove(self, watch: str, q: asyncio.Queue) -> bool:
        """Forget a viewer; True if it was the feed's last one here."""
        qs = self.by_watch.get(watch)
        if qs is None or q not in qs:
            return False
        qs.discard(q)
        self._counted(-1)
        if not qs:
            del self.by_watch[watch]
            return True
        return False

    def close(self, watch: str) -> None:
        """End the responses of a feed's viewers without an event (its pages reconnect and look for it again)."""
        for q in list(self.by_watch.get(watch, ())):
            self._drop(watch, q)

    def _drop(self, watch: str, q: asyncio.Queue) -> None:
        self.remove(watch, q)
        if q.full():
            q.get_nowait()
        q.put_nowait(None)

    def deliver(self, watch: str, event: dict) -> None:
        self._put(list(self.by_watch.get(watch, ())), sse(event), watch)

    def _put(self, queues: list, item, watch: str | None) -> None:
        for q in queues:
            try:
                q.put_nowait(item)
            except asyncio.QueueFull:          # a viewer that does not read: closed (its page reconnects)
                if watch is not None:          # (a keep-alive: the queue holds enough to send)
                    self._drop(watch, q)

    async def keep_alive_forever(self) -> None:
        """An SSE comment to every viewer every KEEPALIVE_S: proxies do not close an idle feed."""
        while True:
            await asyncio.sleep(KEEPALIVE_S)
            self._put([q for qs in self.by_watch.values() for q in qs], KEEPALIVE, None)

    def stop(self) -> None:
        """The server is stopping: every viewer's response ends (their pages find the feed gone)."""
        self.stopped = True
        for stop in self.on_stop:
            stop()
        for qs in self.by_watch.values():
            for q in qs:
                while not q.empty():
                    q.get_nowait()
                q.put_nowait(None)


class LocalShares:
    """Shared captions in one process: the hub and the viewers side by side (server/app.py ServerState)."""

    def __init__(self, limits, metrics=None) -> None:
        self.viewers = Viewers(limits.max_viewers, metrics and metrics.viewers)
        self.hub = ShareHub(self.viewers.deliver, limits.share_grace_s, gauge=metrics and metrics.shared_feeds)

    async def open(self, key: str | None) -> tuple[str, str]:
        if not self.viewers.most:
            raise ShareError(NO_SHARING)
        return self.hub.open(key)

    def word(self, key: str, sentence: int, text: str) -> None:
        self.hub.word(key, sentence, text)

    def sentence(self, key: str, sentence: int) -> None:
        self.hub.sentence(key, sentence)

    def left(self, key: str, ended: bool) -> None:
        self.hub.left(key, ended)

    async def subscribe(self, watch: str) -> asyncio.Queue | str:
        """A viewer's queue, its first event the feed's latest; or why not (NO_FEED, or the viewers' cap)."""
        first = self.hub.last(watch)
        if first is None:
            return NO_FEED
        q = self.viewers.add(watch, first)
        return self.viewers.full if q is None else q

    def unsubscribe(self, watch: str, q: asyncio.Queue) -> None:
        self.viewers.remove(watch, q)

    async def expire_forever(self) -> None:
        await self.hub.expire_forever()


class RemoteShares:
    """Shared captions in a front end of `--workers`/`--engines`: the feeds live in the primary engine process
    (its `link`), which this front end tells each word of its shared streams, and which sends it the events of
    the feeds its viewers watch (server/frontend.py passes them to `shared`)."""

    def __init__(self, state) -> None:
        self.state = state                      # the front end's FrontEndState: its `link` is the primary's
        self.viewers = Viewers(state.settings.limits.max_viewers, state.metrics.viewers)
        self.latest: dict[str, dict] = {}       # watch token -> its latest event, while this front end watches it

    async def open(self, key: str | None) -> tuple[str, str]:
        if not self.viewers.most:
            raise ShareError(NO_SHARING)
        got = await self.state.link.call(lambda req: ShareOpen(req, key))
        if isinstance(got, str):
            raise ShareError(got)
        return tuple(got)

    def word(self, key: str, sentence: int, text: str) -> None:
        self.state.link.send(ShareWord(key, sentence, text))

    def sentence(self, key: str, sentence: int) -> None:
        self.state.link.send(ShareSentence(key, sentence))

    def left(self, key: str, ended: bool) -> None:
        self.state.link.send(ShareLeft(key, ended))

    async def subscribe(self, watch: str) -> asyncio.Queue | str:
        first = self.latest.get(watch)
        if first is None:      # this front end's first viewer of it: the primary adds it to the feed's fronts
            first = await self.state.link.call(lambda req: Watch(req, watch))
            if first is None:
                return NO_FEED
            self.latest.setdefault(watch, first)
        q = self.viewers.add(watch, self.latest[watch])
        if q is None:
            self._forget_if_unwatched(watch)
            return self.viewers.full
        return q

    def unsubscribe(self, watch: str, q: asyncio.Queue) -> None:
        self.viewers.remove(watch, q)
        self._forget_if_unwatched(watch)

    def shared(self, watch: str, event: dict) -> None:
        """An event of a feed this front end watches, from the primary."""
        if watch in self.latest:
            self.latest[watch] = event
        self.viewers.deliver(watch, event)
        if event["ended"]:
            self.latest.pop(watch, None)
        self._forget_if_unwatched(watch)

    def _forget_if_unwatched(self, watch: str) -> None:
        if watch in self.latest and watch not in self.viewers.by_watch:
            del self.latest[watch]
            self.state.link.send(Unwatch(watch))

    async def expire_forever(self) -> None:
        """(the primary engine process expires the feeds)"""
