"""Shared captions across Ray Serve replicas (`serve --ray`; server/share.py, docs/scaling.md).

Ray's proxy sends a viewer's request to whichever replica it picks, not to the speaker's. So under Ray the
feeds live in one named actor of the cluster (`SharedFeeds`, the ShareHub of server/share.py), as they live in
the primary engine process behind `--workers`: each replica tells it every word of its shared streams, and a
replica with viewers of a feed follows that feed's events with a long poll (one call waiting at a time, per
feed and replica), which it hands to its viewers. Viewers stay on the replica they reached.

The actor is one process. If it is lost (its node gone), the first replica to call makes a new one, and each
replica carries its own speakers' feeds on into it (`adopt`: the same keys and watch tokens), within LOOK_S of
the loss; followers wait up to ADOPT_WAIT_S for their feed to come back before they tell their viewers it ended.
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
LOOK_S = 1.0                    # a replica that carries shared streams asks the actor this often whether it is there
ADOPT_WAIT_S = 5.0              # a follower whose actor was lost waits this long for its feed to be carried on


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

    async def adopt(self, key: str, watch: str) -> bool:
        """A feed of a lost actor, carried on by the replica whose stream carries it (ShareHub.adopt)."""
        self._started()
        if not self.hub.adopt(key, watch):
            return False
        self.events.setdefault(watch, (0, self.hub.last(watch)))
        return True

    async def here(self) -> bool:
        return True

    async def apply(self, ops: list[tuple]) -> None:
        """A replica's words, sentence ends and departures, in the order its streams made them: ("word", key,
        sentence, text), ("sentence", key, sentence), ("left", key, ended). (An async actor's calls may run in
        any order, so a replica sends its next batch only once this one is applied: RayShares._send.)"""
        self._started()
        for op in ops:
            getattr(self.hub, op[0])(*op[1:])

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
        self.carried: dict[str, str] = {}     # share key -> watch token, of this replica's streams
        self.latest: dict[str, tuple[int, dict]] = {}   # watch -> latest event, while this replica follows it
        self.followers: dict[str, asyncio.Task] = {}
        self._actor = None
        self.generation = 0
        self.outbox: list[tuple] = []          # ops for the actor's `apply`, in order, not yet sent
        self.sending: asyncio.Task | None = None
        self.carrying: asyncio.Future | None = None   # the carry-on into a new actor, while it runs (`_lost`)

    @property
    def actor(self):
        if self._actor is None:
            self._actor = shared_feeds(self.grace_s, self.namespace)
        return self._actor

    async def _ask(self, method: str, *args):
        """An answered call to the actor. If it is gone (its node lost), the call goes once more, to a new one
        (`_lost`): a share or a viewer that comes after the loss is served at once."""
        for attempt in (1, 2):
            if self.carrying is not None and not self.carrying.done():   # (its words after the carried feeds)
                await asyncio.shield(self.carrying)
            actor = self.actor
            try:
                return await getattr(actor, method).remote(*args)
            except RayActorError:
                if attempt == 2:
                    raise
                await self._lost(actor)

    async def _lost(self, actor) -> None:
        """`actor` is gone: if it is still this replica's handle, a new actor (the first call makes it), into
        which this replica's feeds are carried on before any other call of this replica reaches it.
        `generation` counts the losses: the new actor numbers its events anew."""
        if self._actor is actor:
            self._actor = None
            self.generation += 1
            self.carrying = asyncio.ensure_future(self._carry_on())
        if self.carrying is not None:
            await asyncio.shield(self.carrying)

    async def _carry_on(self) -> None:
        carried = list(self.carried.items())
        log.warning("the shared captions' actor was lost: %d feed(s) of this replica's streams carried on into a "
                    "new one", len(carried))
        actor = self.actor
        for key, watch in carried:
            try:
                await actor.adopt.remote(key, watch)
            except RayError:
                return

    async def open(self, key: str | None) -> tuple[str, str]:
        if not self.viewers.most:
            raise ShareError(NO_SHARING)
        await self._flush()      # (a key carried on after its stream left: the actor has its `left` first)
        try:
            got = await self._ask("open", key)
        except RayError as e:
            self._actor = None
            raise ShareError(f"the shared captions' actor did not answer: {type(e).__name__}") from None
        if isinstance(got, str):
            raise ShareError(got)
        self.carried[got[0]] = got[1]
        self.gauge.set(len(self.carried))
        return tuple(got)

    def word(self, key: str, sentence: int, text: str) -> None:
        self._tell(("word", key, sentence, text))

    def sentence(self, key: str, sentence: int) -> None:
        self._tell(("sentence", key, sentence))

    def left(self, key: str, ended: bool) -> None:
        self._tell(("left", key, ended))
        self.carried.pop(key, None)
        self.gauge.set(len(self.carried))

    def _tell(self, op: tuple) -> None:
        self.outbox.append(op)
        if self.sending is None or self.sending.done():
            self.sending = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        """The outbox to the actor, one call at a time (what comes meanwhile goes in the next): in order."""
        while self.outbox:
            ops, self.outbox = self.outbox, []
            try:
                await self._ask("apply", ops)
            except RayError as e:
                log.warning("the shared captions' actor did not answer (%s): %d word(s) of shared streams lost",
                            type(e).__name__, sum(op[0] == "word" for op in ops))

    async def _flush(self) -> None:
        while self.sending is not None and not self.sending.done():
            await asyncio.shield(self.sending)

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
                generation, actor = self.generation, self.actor
                try:
                    got = await actor.after.remote(watch, self.latest[watch][0], FOLLOW_WAIT_S)
                except RayActorError:
                    await self._lost(actor)
                    got = GONE
                except RayError as e:
                    log.warning("the shared captions' actor did not answer (%s)", type(e).__name__)
                    self._actor, got = None, GONE
                if self.generation != generation:   # (lost meanwhile: the new actor numbers its events anew)
                    got = GONE
                if got is None:
                    continue
                if got == GONE and await self._found_again(watch):
                    continue
                if got == GONE:    # (the actor lost it, and no replica carried it on): the viewers are told
                    log.warning("feed %s ended for its viewers here: the shared captions' actor lost it", watch)
                    got = (self.latest[watch][0] + 1, {**self.latest[watch][1], "ended": True})
                self.latest[watch] = got
                self.viewers.deliver(watch, got[1])
                if got[1]["ended"]:
                    return
        finally:
            self.followers.pop(watch, None)
            self.latest.pop(watch, None)

    async def _found_again(self, watch: str) -> bool:
        """A feed the actor does not know (a new actor, after a loss): True once the replica that carries it has
        carried it on (within ADOPT_WAIT_S); its number is then the new actor's, and its viewers keep what they
        show until its next event."""
        deadline = time.monotonic() + ADOPT_WAIT_S
        while time.monotonic() < deadline and watch in self.viewers.by_watch:
            try:
                got = await self._ask("latest", watch)
            except RayError:
                got = None
            if got is not None:
                self.latest[watch] = (got[0], self.latest[watch][1])
                return True
            await asyncio.sleep(0.25)
        return False

    async def expire_forever(self) -> None:
        """(the actor expires the feeds.) While this replica's streams carry feeds, it asks every LOOK_S whether
        the actor is there: a lost one is replaced and its feeds carried on (`_ask`) even if no viewer or share
        asks before the next word."""
        while True:
            await asyncio.sleep(LOOK_S)
            if self.carried:
                try:
                    await self._ask("here")
                except RayError:
                    pass
