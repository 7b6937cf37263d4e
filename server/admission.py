"""Admission by measured headroom: how many more live streams one model's engine can take while the p99
added delay of its words stays within a budget, and the refusal (`server_busy`, with `retry_after`) of a
stream beyond that.

Who feeds it:
    engine thread : job(rows, cycle_s, lags_ms)  each job: the streams it stepped (rows), the time since the
                                                 job before it ended (the cycle a stream waits between two
                                                 of its steps), the added delay of the words it wrote
    event loop    : admit, admitted, released    a stream asks to start, starts, leaves
                    loop_lag(seconds)            how late the event loop runs (it reads the input and sends
                                                 the words: its lateness adds to every word's delay)
                    refresh(received)            4 times a second: which streams are live (input within
                                                 quiet_s seconds, or admitted that recently), the estimate

The estimate (docs/server.md#admission-by-headroom):
    cycle(D)   the mean cycle a row saw while the engine served D rows per second: a moving average per
               bucket of D (buckets 25 % apart), linear between them, and above the largest D measured
               growing in proportion to D (as if more load batched no better: what was never measured is
               not trusted)
    r          rows per second a live stream adds: rows stepped / live stream-seconds, recent (a prior at first)
    K          the p99 word lag in cycles: p99 word lag / the mean cycle the rows saw, both over the last
               WINDOW_S seconds, at most MAX_K, then a moving average. A word's lag is a number of its
               stream's steps, one cycle apart (a sentence's tail is written one piece per step), so the p99
               grows with the cycle
    capacity   the most live streams N whose demand N·r keeps K·cycle(N·r) + the p99 event-loop lateness
               within TARGET × the budget; while the last WINDOW_S seconds hold fewer than MIN_WORDS words (light
               traffic: no fresh K) at least COLD_STREAMS, unless not even the lightest load measured fits (with
               the measured K, or with K = 1 where none was measured)
    headroom   capacity − live streams; 0 while the measured p99 is over the budget (closed loop: the
               estimate was wrong, or quiet streams came back)
"""
from __future__ import annotations

import dataclasses
import math
import random
import threading
import time
from collections import deque

TARGET = 0.6            # the estimate plans for this share of the budget: the rest absorbs its error
WINDOW_S = 5.0          # recent p99s: the words of the last 5 s
RATE_TAU_S = 10.0       # rows per stream, mean cycle, K, freed shares: moving averages over ~10 s
MIN_WORDS = 20          # fewer words in the window: no measured p99
GUARD_WORDS = 100       # fewer: no closed-loop guard (the p99 of fewer words is their maximum)
PRIOR_K = 20.0          # p99 word lag in cycles until measured
# ...and at most MAX_K: a longer lag is fixed overhead (event-loop round trips, a small model's steps are shorter
# than those), which does not grow with the cycle
MAX_K = 30.0
COLD_STREAMS = 4        # live streams taken before anything is measured
PRIOR_ROWS_S = 9.0      # rows per second of a live stream until measured (a 150 wpm speaker of everyday German)
PRIOR_WEIGHT_S = 20.0   # ...worth this many stream-seconds of measurement
RETRY_MIN_S = 1.0       # the shortest retry_after (or half the longest, if that is shorter)


class WindowQuantile:
    """Quantiles of the observations of the last `window` seconds: one log-bucket histogram (buckets 5 %
    apart, 0.1 ms to 100 s) per slot of window/slots seconds."""
    LOW, RATIO, N = 1e-4, 1.05, 290

    def __init__(self, window: float = WINDOW_S, slots: int = 5):
        self.slot_s, self.slots = window / slots, slots
        self.hist: deque[tuple[int, list[int]]] = deque()   # (slot number, counts)

    def _bucket(self, x: float) -> int:
        if x <= self.LOW:
            return 0
        return min(self.N - 1, 1 + int(math.log(x / self.LOW) / math.log(self.RATIO)))

    def _upper(self, i: int) -> float:
        return self.LOW * self.RATIO ** i

    def _trim(self, now: float) -> int:
        slot = int(now / self.slot_s)
        while self.hist and self.hist[0][0] <= slot - self.slots:
            self.hist.popleft()
        return slot

    def add_many(self, xs, now: float) -> None:
        slot = self._trim(now)
        if not self.hist or self.hist[-1][0] != slot:
            self.hist.append((slot, [0] * self.N))
        counts = self.hist[-1][1]
        for x in xs:
            counts[self._bucket(x)] += 1

    def count(self, now: float) -> int:
        self._trim(now)
        return sum(sum(c) for _, c in self.hist)

    def quantile(self, q: float, now: float, min_count: int = 1) -> float | None:
        """The q-quantile (0-1), as the upper bound of its bucket (never under the truth by more than 5 %);
        None with fewer than min_count observations."""
        self._trim(now)
        total = [sum(c[i] for _, c in self.hist) for i in range(self.N)]
        n = sum(total)
        if n < max(1, min_count):
            return None
        rank, seen = q * n, 0
        for i, c in enumerate(total):
            seen += c
            if seen >= rank:
                return self._upper(i)
        return self._upper(self.N - 1)


class Curve:
    """y as a function of x, learned: a moving average of (x, y) per bucket of x (bucket bounds `ratio` apart)."""
    ALPHA = 0.05

    def __init__(self, ratio: float = 2.0, from_below: bool = True):
        self.log_ratio, self.from_below = math.log(ratio), from_below
        self.buckets: dict[int, list[float]] = {}   # bucket -> [mean x, mean y, observations]

    def add(self, x: float, y: float) -> None:
        k = int(math.log(max(x, 1.0)) / self.log_ratio)
        m = self.buckets.get(k)
        if m is None:
            self.buckets[k] = [float(x), y, 1]
            return
        a = max(self.ALPHA, 1 / (m[2] + 1))   # a plain mean until there are 1/ALPHA observations
        m[0] += a * (x - m[0])
        m[1] += a * (y - m[1])
        m[2] += 1

    def points(self) -> list[tuple[float, float]]:
        """(x, y) per bucket, x ascending, y made non-decreasing (more rows, or streams, never cost less): from
        below, a bucket is raised to the highest y before it; else lowered to the lowest after it (a bucket
        measured once, long ago, cannot then hold down every larger x)."""
        pts = [(x, y) for _, (x, y, _) in sorted(self.buckets.items())]
        ys = [y for _, y in pts]
        for i in (range(1, len(ys)) if self.from_below else range(len(ys) - 2, -1, -1)):
            ys[i] = max(ys[i], ys[i - 1]) if self.from_below else min(ys[i], ys[i + 1])
        return [(x, y) for (x, _), y in zip(pts, ys)]


def demand_limit(cycles: list[tuple[float, float]], max_cycle: float) -> float:
    """The most rows per second whose cycle stays within max_cycle, from the cycle curve's points (rows/s,
    seconds): the first's cycle below it, linear between points, in proportion to the rows above the last."""
    if not cycles or cycles[0][1] > max_cycle:
        return 0.0
    for (d0, c0), (d1, c1) in zip(cycles, cycles[1:]):
        if c1 > max_cycle:
            return d0 + (d1 - d0) * (max_cycle - c0) / max(c1 - c0, 1e-12)
    d, c = cycles[-1]
    return d * max_cycle / max(c, 1e-12)


@dataclasses.dataclass
class Headroom:
    """The estimate, as /health, /metrics and the server log report it."""
    streams: int                 # more streams it can take now
    capacity: int                # live streams it can keep within the budget
    live: int                    # streams holding a share (input within quiet_s, or just admitted)
    delay_budget_ms: float
    state: str                   # cold (nothing measured yet), measured, over_budget (the closed-loop guard)
    # p99_ms: the last WINDOW_S seconds: p99 word lag + p99 event-loop lateness (None: too few words)
    p99_ms: float | None
    lag_p99_ms: float | None
    loop_p99_ms: float | None
    rows_per_stream_s: float     # r
    demand_rows_s: float         # rows per second served lately
    max_demand_rows_s: float     # the most rows per second that keep K·cycle within TARGET × the budget
    cycle_ms: float | None       # the mean cycle the rows saw lately
    delay_in_cycles: float       # K
    busy: float                  # the engine's busy share lately (job time / wall time)

    def as_dict(self) -> dict:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in dataclasses.asdict(self).items()}


def combine(parts: list[Headroom]) -> Headroom:
    """Several engine processes' estimates of one model (`serve --engines N`) as one: what they take and keep
    adds up; a delay is the worst of them; the state is over_budget if any engine is, cold if all are."""
    if len(parts) == 1:
        return parts[0]

    def worst(name):
        values = [getattr(p, name) for p in parts if getattr(p, name) is not None]
        return max(values) if values else None

    states = {p.state for p in parts}
    state = "over_budget" if "over_budget" in states else "cold" if states == {"cold"} else "measured"
    total = {name: sum(getattr(p, name) for p in parts)
             for name in ("streams", "capacity", "live", "demand_rows_s", "max_demand_rows_s")}
    return dataclasses.replace(parts[0], state=state, **total,
                               **{n: worst(n) for n in ("p99_ms", "lag_p99_ms", "loop_p99_ms", "cycle_ms")},
                               rows_per_stream_s=sum(p.rows_per_stream_s for p in parts) / len(parts),
                               delay_in_cycles=max(p.delay_in_cycles for p in parts),
                               busy=max(p.busy for p in parts))


class Admission:
    """One engine's headroom and its admission decisions (see the module docstring). Disabled, it still
    estimates (for /health and /metrics) and admits every stream."""

    def __init__(self, *, delay_budget_ms: float = 100.0, quiet_s: float = 10.0, retry_max_s: float = 30.0,
                 enabled: bool = True, clock=time.monotonic, rng: random.Random | None = None):
        self.budget_s, self.quiet_s, self.enabled = delay_budget_ms / 1000, quiet_s, enabled
        self.retry_max_s = retry_max_s
        self.clock, self.rng = clock, rng or random.Random()
        self._lock = threading.Lock()         # engine thread and event loop
        self.lags = WindowQuantile()          # word lags, seconds: engine thread
        self.loop = WindowQuantile()          # event-loop lateness, seconds
        self._rows = 0                        # rows stepped since the last refresh
        self._busy = 0.0                      # Σ job cycles since the last refresh
        self._row_cycles = 0.0                # Σ rows·cycle since the last refresh
        # event loop only
        self.cycles = Curve(1.25, from_below=False)   # mean cycle (s) by rows per second served
        self.active: dict[int, tuple[int, float]] = {}   # stream -> (input words seen, when last active)
        self.live: set[int] = set()
        # decayed sums over RATE_TAU_S: rows, rows·cycle, live stream-seconds, busy seconds, wall seconds
        self.rows_avg = self.row_cycles_avg = self.live_s_avg = self.busy_avg = self.wall_avg = 0.0
        self.freed_avg = 0.0                  # shares freed (or capacity gained) per second, moving average
        self.k: float | None = None           # K, moving average
        self.recent: deque[tuple[float, float, float]] = deque()   # (time, rows, rows·cycle) per refresh
        self._freed = 0
        self.refusals: deque[float] = deque()   # when the recent refusals were sent
        self.last_refresh = clock()
        self.cap = COLD_STREAMS
        self.estimate = Headroom(COLD_STREAMS, COLD_STREAMS, 0, delay_budget_ms, "cold", None, None, None,
                                 PRIOR_ROWS_S, 0.0, 0.0, None, PRIOR_K, 0.0)

    # ---- engine thread -------------------------------------------------------------------------
    def job(self, rows: int, cycle_s: float, lags_ms=()) -> None:
        with self._lock:
            self._busy += cycle_s
            self._rows += rows
            self._row_cycles += rows * cycle_s
            if lags_ms:
                self.lags.add_many([x / 1000 for x in lags_ms], self.clock())

    # ---- event loop ------------------------------------------------------------------------------
    def loop_lag(self, seconds: float) -> None:
        with self._lock:
            self.loop.add_many((max(0.0, seconds),), self.clock())

    def admit(self, record: bool = True) -> float | None:
        """None: the stream may start (call `admitted` once it has); else refused: the seconds after which
        to try again. record=False: the refusal is not counted among the refused clients that retry_after
        spreads (the client is tried elsewhere first)."""
        if not self.enabled or not self.live or len(self.live) < self._open_capacity():
            return None
        if record:
            self.refusals.append(self.clock())
        return self.retry_after()

    def _open_capacity(self) -> int:
        return 0 if self.estimate.state == "over_budget" else self.cap

    def admitted(self, sid: int) -> None:
        self.active[sid] = (0, self.clock())
        self.live.add(sid)

    def released(self, sid: int) -> None:
        self.active.pop(sid, None)
        if sid in self.live:
            self.live.discard(sid)
            self._freed += 1

    def retry_after(self) -> float:
        """When to try again: drawn evenly between the shortest wait and the time the shares that came free
        lately (streams leaving or going quiet, capacity growing) take to serve the clients refused in the last
        retry_max_s seconds, at most retry_max_s (twice the shortest while nothing is measured). Spread so, the
        refused clients come back about as fast as shares free, not all together."""
        now, longest = self.clock(), self.retry_max_s
        shortest = min(RETRY_MIN_S, longest / 2)
        while self.refusals and self.refusals[0] < now - longest:
            self.refusals.popleft()
        if self.estimate.state == "cold":
            drain = 2 * shortest
        else:
            drain = len(self.refusals) / max(self.freed_avg, 1 / longest)
        return round(self.rng.uniform(shortest, min(longest, max(2 * shortest, drain))), 2)

    def refresh(self, received) -> Headroom:
        """Recompute the estimate; `received`: (stream, input words received so far) of each open stream."""
        now = self.clock()
        dt = now - self.last_refresh
        self.last_refresh = now
        for sid, n in received:
            seen = self.active.get(sid)
            if seen is None or seen[0] != n:
                self.active[sid] = (n, now)
        live = {sid for sid, (_, t) in self.active.items() if now - t <= self.quiet_s}
        self._freed += len(self.live - live)
        self.live = live
        with self._lock:
            rows, row_cycles, busy = self._rows, self._row_cycles, self._busy
            self._rows, self._row_cycles, self._busy = 0, 0.0, 0.0
            lag = self.lags.quantile(0.99, now, MIN_WORDS)
            words = self.lags.count(now)
            loop = self.loop.quantile(0.99, now) or 0.0
        if dt > 0 and rows:
            self.cycles.add(rows / dt, row_cycles / rows)
        decay = math.exp(-dt / RATE_TAU_S)
        self.rows_avg = decay * self.rows_avg + rows
        self.row_cycles_avg = decay * self.row_cycles_avg + row_cycles
        self.live_s_avg = decay * self.live_s_avg + len(live) * dt
        self.busy_avg = decay * self.busy_avg + busy
        self.wall_avg = decay * self.wall_avg + dt
        r = (self.rows_avg + PRIOR_ROWS_S * PRIOR_WEIGHT_S) / (self.live_s_avg + PRIOR_WEIGHT_S)
        cycle = self.row_cycles_avg / self.rows_avg if self.rows_avg > 1e-9 else None
        p99 = None if lag is None else lag + loop
        self.recent.append((now, rows, row_cycles))   # the cycle over the p99's window, for K
        while self.recent[0][0] < now - WINDOW_S:
            self.recent.popleft()
        recent_rows = sum(x[1] for x in self.recent)
        if lag is not None and recent_rows:
            k_now = min(MAX_K, max(1.0, lag * recent_rows / sum(x[2] for x in self.recent)))
            self.k = k_now if self.k is None else self.k + (1 - decay) * (k_now - self.k)
        k = PRIOR_K if self.k is None else self.k
        room = max(0.0, TARGET * self.budget_s - loop)   # what the words' lag may take of the budget
        points = self.cycles.points()
        most = demand_limit(points, room / k)
        cap = int(most / max(r, 1e-3)) if self.cycles.buckets else COLD_STREAMS
        if words < MIN_WORDS and (most > 0 or self.k is None and demand_limit(points, room) > 0):
            # light traffic: K is the prior or from a busier time, and both overstate a few streams' lag in cycles
            # (11-12 measured at 2-3 speakers, 15-19 at 50-200), so that one speaker's cycle could refuse a second;
            # a few streams are taken as on a cold server and their words measure K. Not where nothing fits: the
            # lightest load measured over the budget with the measured K, or (K unmeasured) with K = 1
            cap = max(cap, COLD_STREAMS)
        if dt > 0:
            self._freed += max(0, cap - self.cap)
            self.freed_avg = decay * self.freed_avg + (1 - decay) * self._freed / dt
            self._freed = 0
        self.cap = cap
        if not self.cycles.buckets:
            state = "cold"
        elif p99 is not None and p99 > self.budget_s and words >= GUARD_WORDS:
            state = "over_budget"
        else:
            state = "measured"
        ms = lambda x: None if x is None else x * 1000  # noqa: E731
        self.estimate = Headroom(0, cap, len(live), self.budget_s * 1000, state, ms(p99), ms(lag), ms(loop), r,
                                 self.rows_avg / self.wall_avg if self.wall_avg else 0.0, most, ms(cycle), k,
                                 self.busy_avg / self.wall_avg if self.wall_avg else 0.0)
        self.estimate.streams = self.headroom()
        return self.estimate

    def headroom(self) -> int:
        """More streams it can take now (a server with no live stream always takes one)."""
        free = max(0, self._open_capacity() - len(self.live))
        return max(free, 0 if self.live else 1)

    def current(self) -> Headroom:
        """The last estimate with the streams admitted or gone since."""
        return dataclasses.replace(self.estimate, streams=self.headroom(), live=len(self.live))
