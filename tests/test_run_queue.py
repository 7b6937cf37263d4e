"""server/run_queue.py against the rule it keeps: each job gets, of the streams that can move, the `limit`
stepped longest ago, while looking only at the woken streams and as far into the queue as that takes; and no
wake-up is lost when handlers wake streams from another thread while jobs select."""
from __future__ import annotations

import random
import threading
from dataclasses import dataclass

import pytest

from server.run_queue import RunQueue


@dataclass(eq=False)
class Stream:
    id: int
    last_step: float = 0.0
    closed: bool = False
    movable: bool = False   # what the engine's _can_move reads off the stream's state
    looked: int = 0


def can_move(h: Stream) -> bool:
    h.looked += 1
    return h.movable


@pytest.mark.parametrize("seed", range(6))
def test_each_job_gets_the_oldest_streams_that_can_move(seed):
    rng = random.Random(seed)
    streams = [Stream(i) for i in range(rng.choice([40, 300]))]
    q, limit = RunQueue(), rng.choice([1, 8, 32])
    for job in range(1, 400):
        for h in rng.sample(streams, rng.randrange(0, 12)):   # commands arrive: the stream can move, then wakes
            if not h.closed:
                h.movable = True
                q.wake(h)
        if rng.random() < 0.05:
            rng.choice(streams).closed = True
        for h in streams:
            h.looked = 0
        picked = q.select(limit, can_move)
        movable = [h for h in streams if h.movable and not h.closed]
        assert len(picked) == min(limit, len(movable)) and len(set(map(id, picked))) == len(picked)
        assert all(h.movable and not h.closed for h in picked)
        rest = [h.last_step for h in movable if h not in picked]
        if picked and rest:   # the oldest: none left behind stepped before one taken
            assert max(h.last_step for h in picked) <= min(rest)
        # it looked at no stream twice, and past the woken ones at no more than it took and dropped
        assert all(h.looked <= 1 for h in streams)
        for h in picked:   # the job: each stream writes, reads or ends; some can move on at once
            h.last_step = float(job)
            h.movable = rng.random() < 0.7
        q.stepped(picked, can_move)


def test_a_job_looks_no_further_than_it_takes():
    """At 1,024 streams that can all move and a limit of 256, a job looks at 256 of them, not 1,024."""
    streams = [Stream(i, movable=True) for i in range(1024)]
    q = RunQueue()
    for h in streams:
        q.wake(h)
    for job in range(1, 9):
        for h in streams:
            h.looked = 0
        picked = q.select(256, can_move)
        assert len(picked) == 256 and sum(h.looked for h in streams) == 256
        # round robin: each stream in turn, the ones stepped longest ago first
        assert {h.id for h in picked} == set(range(256 * ((job - 1) % 4), 256 * ((job - 1) % 4 + 1)))
        for h in picked:
            h.last_step = float(job)
        q.stepped(picked, can_move)


def test_streams_that_cannot_move_leave_until_woken():
    a, b = Stream(1, movable=True), Stream(2, movable=False)
    q = RunQueue()
    q.wake(a), q.wake(b)
    assert q.select(8, can_move) == [a] and q.ids() == {1}
    a.movable = False
    q.stepped([a], can_move)
    assert q.ids() == set() and q.select(8, can_move) == []
    b.movable = True
    q.wake(b)
    assert q.select(8, can_move) == [b]
    q.stepped([b], can_move)
    assert q.ids() == {2}
    b.closed = True            # the client left: the next job drops it
    assert q.select(8, can_move) == [] and q.ids() == set()


def test_no_wake_up_is_lost_between_threads():
    """A handler thread queues commands and wakes streams while the engine thread selects and steps them: every
    command is served (a stream whose command was queued after a look is woken again)."""
    rng = random.Random(1)
    streams = [Stream(i) for i in range(64)]
    commands = {h.id: 0 for h in streams}     # queued by the handler, served by the engine
    served = {h.id: 0 for h in streams}
    lock = threading.Lock()
    q, total, stop = RunQueue(), 20000, threading.Event()

    def handler():
        for _ in range(total):
            h = rng.choice(streams)
            with lock:
                commands[h.id] += 1
            q.wake(h)

    def pending(h: Stream) -> bool:
        with lock:
            return commands[h.id] > served[h.id]

    def engine():
        job = 0
        while not stop.is_set() or any(pending(h) for h in streams):
            picked = q.select(8, pending)
            job += 1
            for h in picked:
                with lock:
                    served[h.id] = commands[h.id]
                h.last_step = float(job)
            q.stepped(picked, pending)

    t = threading.Thread(target=handler)
    e = threading.Thread(target=engine)
    e.start(), t.start()
    t.join()
    stop.set()
    e.join(timeout=60)
    assert not e.is_alive()
    assert served == commands and sum(commands.values()) == total
