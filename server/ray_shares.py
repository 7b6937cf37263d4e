"""Shared captions across Ray Serve replicas (`serve --ray`; server/share.py, docs/scaling.md).

Ray's proxy sends a viewer's request to whichever replica it picks, not to the speaker's. So under Ray the
feeds live in one named actor of the cluster (`SharedFeeds`, the ShareHub of server/share.py), as they live in
the primary engine process behind `--workers`: each replica tells it every word of its shared streams, and a
replica with viewers of a feed follows that feed's events with a long poll (one call waiting at a time, per
feed and replica), which it hands to its viewers. Viewers stay on the replica they reached.
"""
from __future__ import annotations

import asyncio
import logging
import time

import ray
from ray.exceptions import RayActorError, RayError

from server.share import NO_FEED, NO_SHARING, ShareError, ShareHub, Viewers

log = logging.getLogger("simulserve.ray")
SHARES = "simulserve-shares"    # the named actor, in the deployment's namespace (server/ray_serve.py NAMESPACE)
FOLLOW_WAIT_S = 10.0            # a follower's poll returns after this long without an event (then looks again)
ENDED_KEPT_S = 60.0             # an ended feed's last event stays this long for followers that were waiting
GONE = "gone"


@ray.remote(num_cpus=0)
class SharedFeeds:
    """Every feed of the deployment. Async methods: they run on the actor's event loop, and one that does not
    await runs whole, so the words a replica sends are applied in the order it sent them."""

    def __init__(self, grace_s: float):
        self.hub = ShareHub(self._emit, grace_s)
        self.events: dict[str, tuple[int, dict]] = {}    # watch token -> (event number, latest event)
        self.ended_at: dict[str, float] = {}
        self.tick: asyncio.Event | None = None            # set (and replaced) at every event
        self.expiring: asyncio.Task | None = None

    def _started(self) -> None:   # (the loop exists only once a method runs)
        if self.tick is None:
            self.tick = asyncio.Event()
            self.expiring = asyncio.get_running_loop().create_task(self.hub.expire_forever(also=self._forget_ended))

    def _emit(self, watch: str, event: dict) -> None:
        self.events[watch] = (self.events.get(watch, (0, None))[0] + 1, event)
        if event["ended"]:
            self.ended_at[watch] = time.monotonic()
        self.tick.set()
        self.tick = asyncio.Event()

    def _forget_ended(self) -> None:
        now = time.monotonic()
        for watch, at in list(self.ended_at.items()):
            if now - at >= ENDED_KEPT_S:
                del self.ended_at[watch], self.events[watch]

    async def open(self, key: str | None):
        """(key, watch), or why not as a string (a ShareError's text)."""
        self._started()
        try:
            key, watch = self.hub.open(key)
        except ShareError as e:
            return str(e)
        self.events.setdefault(watch, (0, self.hub.last(watch)))
        return key, watch

    async def word(self, key: str, sentence: int, text: str) -> None:
        self._started()
        self.hub.word(key, sentence, text)

    async def sentence(self, key: str, sentence: int) -> None:
        self.hub.sentence(key, sentence)

    async def left(self, key: str, ended: bool) -> None:
        self._started()
        self.hub.left(key, ended)

    async def latest(self, watch: str):
        """(event number, latest event) of a live feed, or None."""
        return self.events.get(watch) if self.hub.last(watch) is not None else None

    async def after(self, watch: str, seen: int, wait_s: float):
        """The feed's first event past number `seen`, as (number, event); None if none came within wait_s;
        GONE if the feed is unknown (ended long ago, or the actor started again)."""
        self._started()
        deadline = time.monotonic() + wait_s
        while True:
            got = self.events.get(watch)
            if got is None:
                return GONE
            if got[0] > seen:
                return got
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                await asyncio.wait_for(self.tick.wait(), left)
            except TimeoutError:
                return None


def shared_feeds(grace_s: float, namespace: str):
    return SharedFeeds.options(name=SHARES, namespace=namespace, lifetime="detached",
                               get_if_exists=True).remote(grace_s)


class RayShares:
    """A replica's side: the interface of server/share.py LocalShares, the feeds in the SharedFeeds actor.
    `simulserve_shared_feeds` counts the feeds this replica's streams carry."""

    def __init__(self, limits, metrics, namespace: str) -> None:
        self.viewers = Viewers(limits.max_viewers, metrics.viewers)
        self.grace_s, self.namespace, self.gauge = limits.share_grace_s, namespace, metrics.shared_feeds
        self.carried: set[str] = set()
        self.latest: dict[str, tuple[int, dict]] = {}   # watch -> latest event, while this replica follows it
        self.followers: dict[str, asyncio.Task] = {}
        self._actor = None

    @property
    def actor(self):
        if self._actor is None:
            self._actor = shared_feeds(self.grace_s, self.namespace)
        return self._actor

    async def _ask(self, method: str, *args):
        """An answered call to the actor. If it is gone (its node lost), the call goes once more to a new one,
        made by the first replica that asks (get_if_exists), whose feeds start empty: a share or a viewer that
        comes after the loss is served at once, not refused once for every replica that held the old handle."""
        for attempt in (1, 2):
            actor = self.actor
            try:
                return await getattr(actor, method).remote(*args)
            except RayActorError:
                if self._actor is actor:
                    self._actor = None
                if attempt == 2:
                    raise

    async def open(self, key: str | None) -> tuple[str, str]:
        if not self.viewers.most:
            raise ShareError(NO_SHARING)
        try:
            got = await self._ask("open", key)
        except RayError as e:
            self._actor = None
            raise ShareError(f"the shared captions' actor did not answer: {type(e).__name__}") from None
        if isinstance(got, str):
            raise ShareError(got)
        self.carried.add(got[0])
        self.gauge.set(len(self.carried))
        return tuple(got)

    def word(self, key: str, sentence: int, text: str) -> None:
        self.actor.word.remote(key, sentence, text)

    def sentence(self, key: str, sentence: int) -> None:
        self.actor.sentence.remote(key, sentence)

    def left(self, key: str, ended: bool) -> None:
        self.actor.left.remote(key, ended)
        self.carried.discard(key)
        self.gauge.set(len(self.carried))

    async def subscribe(self, watch: str) -> asyncio.Queue | str:
        first = self.latest.get(watch)
        if first is None:        # this replica's first viewer of it
            try:
                first = await self._ask("latest", watch)
            except RayError:
                self._actor = None
                first = None
            if first is None:
                return NO_FEED
        q = self.viewers.add(watch, first[1])
        if q is None:
            return self.viewers.full
        if watch not in self.followers:
            self.latest[watch] = first
            self.followers[watch] = asyncio.create_task(self._follow(watch))
        return q

    def unsubscribe(self, watch: str, q: asyncio.Queue) -> None:
        self.viewers.remove(watch, q)      # (the follower stops at its next look)

    async def _follow(self, watch: str) -> None:
        """The feed's events to this replica's viewers of it, while it has any."""
        try:
            while watch in self.viewers.by_watch:
                try:
                    got = await self.actor.after.remote(watch, self.latest[watch][0], FOLLOW_WAIT_S)
                except RayError as e:
                    log.warning("the shared captions' actor did not answer (%s): feed %s ended for its viewers "
                                "here", type(e).__name__, watch)
                    self._actor, got = None, GONE
                if got is None:
                    continue
                if got == GONE:    # (the actor lost it): the viewers are told it has ended
                    got = (self.latest[watch][0] + 1, {**self.latest[watch][1], "ended": True})
                self.latest[watch] = got
                self.viewers.deliver(watch, got[1])
                if got[1]["ended"]:
                    return
        finally:
            self.followers.pop(watch, None)
            self.latest.pop(watch, None)

    async def expire_forever(self) -> None:
        """(the actor expires the feeds)"""
        await asyncio.Event().wait()
