"""Which streams the engine's next job steps: those that can make progress, the ones stepped longest ago first,
found without looking at every stream that could.

The rule is the engine's fairness rule (server/engine.py): of the streams that can move, the `limit` with the
oldest `last_step`. Looking at all of them each job cost 0.67 ms a job at 1,024 flat-out streams on the 2-core
EPYC (`recipes/engine_flat_out.py --tiny`), where a job takes 256. Here a job looks at the streams woken since
the last one and, of the others, only as far as it takes:

- `queued`: streams a job stepped that could move on at once, in the order they were stepped. A job's streams
  share its time, and each job's come after every earlier one's, so this order is `last_step` order.
- `fresh`: streams woken by their handlers (a command queued) that are not queued, with whatever `last_step`
  they have: few, sorted when a job looks.

A job merges the two by `last_step` (ties: queued first, then fresh in the order woken, as a stable sort of the
old scan's order gave) and stops at `limit` streams that can move; those it met that cannot are dropped, and a
later command wakes them again. Only the engine thread calls `select` and `stepped`; handlers call `wake` from the
event loop. A handler queues its command before it wakes the stream, and `select` takes the woken ones before it
looks at any, so a command is either seen by the look or wakes the stream again: no wake-up is lost.
"""
from __future__ import annotations

from typing import Callable, Protocol


class Runnable(Protocol):
    id: int
    closed: bool
    last_step: float


class RunQueue:
    def __init__(self):
        self._woken: dict[int, Runnable] = {}    # handlers add (any thread); the engine thread takes them
        self._fresh: dict[int, Runnable] = {}    # woken, not queued, not stepped since (in the order woken)
        self._queued: dict[int, Runnable] = {}   # stepped and able to move on, in last_step order

    def wake(self, h: Runnable) -> None:
        """The stream may be able to move (a command was queued for it first). Any thread."""
        self._woken[h.id] = h

    def ids(self) -> set[int]:
        """The streams a job may look at (woken, fresh or queued)."""
        return set(self._woken) | set(self._fresh) | set(self._queued)

    def __len__(self) -> int:
        return len(self.ids())

    def select(self, limit: int, can_move: Callable[[Runnable], bool]) -> list[Runnable]:
        """Up to `limit` streams that can move, those stepped longest ago first (engine thread). They stay
        where they are until `stepped`; the streams met on the way that cannot move, or are closed, leave."""
        for k in list(self._woken):   # (in the order woken; one C-level copy: handlers may add meanwhile)
            h = self._woken.pop(k)
            if k not in self._queued and k not in self._fresh:
                self._fresh[k] = h
        fresh = sorted(self._fresh.values(), key=_last_step)   # (stable: in the order woken among equals)
        queued = iter(self._queued.values())
        q = next(queued, None)
        i, out, left_fresh, left_queued = 0, [], [], []
        while len(out) < limit:
            if i < len(fresh) and (q is None or fresh[i].last_step < q.last_step):
                h, i = fresh[i], i + 1
                left = left_fresh
            elif q is not None:
                h, q = q, next(queued, None)
                left = left_queued
            else:
                break
            if not h.closed and can_move(h):
                out.append(h)
            else:
                left.append(h.id)
        for k in left_fresh:
            del self._fresh[k]
        for k in left_queued:
            del self._queued[k]
        return out

    def stepped(self, batch: list[Runnable], can_move: Callable[[Runnable], bool]) -> None:
        """After a job (engine thread): its streams go to the back of the queue if they can move on at once
        (their last_step is the newest), else they leave it until a command wakes them."""
        for h in batch:
            self._fresh.pop(h.id, None)
            self._queued.pop(h.id, None)
            if not h.closed and can_move(h):
                self._queued[h.id] = h


def _last_step(h: Runnable) -> float:
    return h.last_step
