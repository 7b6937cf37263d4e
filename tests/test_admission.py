"""Admission by measured headroom (server/admission.py).

Unit tests feed the estimate made-up measurements on a made-up clock: an engine whose cycle grows with the
rows per second it serves, words whose p99 lag is a known number of cycles. The estimate must find the
capacity those imply, refuse beyond it, stop admitting while the measured p99 is over the budget, free the
share of a quiet stream, and spread its retry_after.

The end-to-end tests flood a real uvicorn server (tiny model, a delay budget so small that one stream at a
time is all it can keep within it: the real estimate says so) with real websocket clients: every admitted
stream completes with the words of an idle run, every refused one gets `server_busy` with `retry_after`
and gets in on retry, /health answers throughout, and memory and the gauges come back to where they were.
"""
from __future__ import annotations

import asyncio
import json
import random
import threading
import time

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from models.data.synthetic import make_pairs
from server.admission import COLD_STREAMS, GUARD_WORDS, TARGET, Admission, Curve, WindowQuantile, demand_limit
from server.protocol import ERRORS, server_adapter
from test_server import LiveServer


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def feed(adm: Admission, clock: Clock, streams: int, cycle_of, seconds: float, *, rows_per_stream: float = 9.0,
         k: float = 15.0, loop_s: float = 0.002, start_id: int = 0) -> None:
    """`streams` live streams for `seconds`: the engine serves their rows in back-to-back jobs whose cycle is
    cycle_of(rows per second), and their words lag up to k cycles (p99 ≈ k·cycle)."""
    ids = list(range(start_id, start_id + streams))
    for sid in ids:
        if sid not in adm.active:
            adm.admitted(sid)
    words = {sid: 0 for sid in ids}
    rng = random.Random(0)
    for _ in range(int(seconds / 0.25)):
        demand = streams * rows_per_stream
        cycle = cycle_of(demand)
        jobs = max(1, int(0.25 / cycle)) if streams else 0
        for _ in range(jobs):
            clock.t += 0.25 / jobs
            lags = [rng.uniform(0, k * cycle * 1000) for _ in range(3)]
            adm.job(demand * cycle, cycle, lags)          # (rows per job: a mean, need not be whole)
        if not jobs:
            clock.t += 0.25
        for _ in range(5):
            adm.loop_lag(loop_s)
        for sid in ids:
            words[sid] += 1
        adm.refresh(list(words.items()))


def linear_cycle(d: float) -> float:
    return 0.002 + 2e-6 * d            # 2 ms alone, +2 µs per row per second served


def true_capacity(k=15.0, loop_s=0.002, budget_s=0.1, r=9.0) -> float:
    """The most streams with k·cycle(N·r) + loop within TARGET × the budget, for linear_cycle."""
    return ((TARGET * budget_s - loop_s) / k - 0.002) / 2e-6 / r


# ---------------------------------------------------------------- the pieces
def test_window_quantile_is_close_and_forgets_old_slots():
    w = WindowQuantile(window=5.0, slots=5)
    w.add_many([i / 1000 for i in range(1, 1001)], now=0.0)     # 1..1000 ms
    p99 = w.quantile(0.99, now=0.5)
    assert 0.990 <= p99 <= 0.990 * 1.06                          # the bucket's upper bound, buckets 5 % apart
    assert w.quantile(0.99, now=0.5, min_count=2000) is None
    w.add_many([0.001] * 10, now=6.0)                             # the first slot has left the window
    assert w.count(6.0) == 10 and w.quantile(0.99, now=6.0) < 0.0012


def test_curve_points_are_bucket_means_made_non_decreasing():
    c = Curve(2.0, from_below=False)
    for x, y in [(1, 0.009), (3, 0.002), (3, 0.004), (10, 0.005), (40, 0.004)]:
        c.add(x, y)
    pts = c.points()
    assert [round(x) for x, _ in pts] == [1, 3, 10, 40]
    assert [y for _, y in pts] == pytest.approx([0.003, 0.003, 0.004, 0.004])   # lowered from above
    up = Curve(2.0, from_below=True)
    for x, y in [(1, 0.009), (3, 0.002)]:
        up.add(x, y)
    assert [y for _, y in up.points()] == pytest.approx([0.009, 0.009])


def test_demand_limit_interpolates_and_extrapolates_in_proportion():
    pts = [(100.0, 0.002), (500.0, 0.003), (1000.0, 0.005)]
    assert demand_limit([], 0.01) == 0
    assert demand_limit(pts, 0.001) == 0                       # not even the lightest load measured fits
    assert demand_limit(pts, 0.004) == pytest.approx(750)      # halfway between 500 and 1000
    assert demand_limit(pts, 0.010) == pytest.approx(2000)     # beyond: the cycle grows with the rows


# ---------------------------------------------------------------- the estimate
def test_cold_server_takes_a_few_streams_then_refuses_with_a_short_retry():
    clock = Clock()
    adm = Admission(clock=clock, rng=random.Random(1))
    for sid in range(COLD_STREAMS):                             # nothing measured yet: a few
        assert adm.admit() is None
        adm.admitted(sid)
    wait = adm.admit()
    assert wait is not None and 1.0 <= wait <= 2.0              # nothing measured: come back soon
    assert adm.current().state == "cold" and adm.current().streams == 0


def light(adm: Admission, clock: Clock, streams: list[int], cycle: float, seconds: float, words_s: float = 2.0) -> None:
    """`streams` speaking slowly for `seconds`: a job of one row each `cycle`·4 seconds, words_s words a second
    in all (under MIN_WORDS in the 5 s window), each lagging 3 cycles."""
    for sid in streams:
        if sid not in adm.active:
            adm.admitted(sid)
    said = 0
    for i in range(int(seconds / 0.25)):
        for _ in range(int(0.25 / (4 * cycle))):
            clock.t += 4 * cycle
            adm.job(1, cycle)
        adm.job(0, 0.0, [3 * cycle * 1000] * round(words_s * (i + 1) * 0.25 - said))
        said = round(words_s * (i + 1) * 0.25)
        adm.loop_lag(0.002)
        adm.refresh([(sid, said) for sid in streams])


def test_light_traffic_takes_a_few_streams_whatever_the_prior_says():
    """One slow speaker on a CPU whose lone step cycle is 5 ms: with the prior K (20 cycles) the estimate keeps 0
    streams, and refused a second speaker on an idle server. Under MIN_WORDS words in the window the estimate
    takes a few, as a cold server does, and the words of more streams measure K."""
    clock = Clock()
    adm = Admission(clock=clock, rng=random.Random(1))
    light(adm, clock, [0], cycle=0.005, seconds=10)
    e = adm.current()
    assert e.state == "measured" and e.delay_in_cycles == 20 and e.max_demand_rows_s == 0   # the prior: none fits
    assert e.capacity == COLD_STREAMS and e.streams == COLD_STREAMS - 1
    for sid in range(1, COLD_STREAMS):
        assert adm.admit() is None
        adm.admitted(sid)
    assert adm.admit() is not None                                  # a few, not any number
    feed(adm, clock, COLD_STREAMS, lambda d: 0.005, 10, k=4.0)      # their words measure K: the estimate decides
    e = adm.current()
    assert e.delay_in_cycles == pytest.approx(4, rel=0.2) and e.capacity > COLD_STREAMS


def test_light_traffic_keeps_no_floor_where_one_cycle_is_over_the_budget():
    """K never measured, and the lone stream's cycle (5 ms) is over the budget's share even if a word took one
    cycle (a 1 µs budget, as the caption page's busy test uses): one stream at a time, as before."""
    clock = Clock()
    adm = Admission(delay_budget_ms=0.001, clock=clock, rng=random.Random(1))
    light(adm, clock, [0], cycle=0.005, seconds=10)
    e = adm.current()
    assert e.delay_in_cycles == 20 and e.capacity == 0 and adm.admit() is not None


def test_light_traffic_keeps_no_floor_where_a_measured_k_says_nothing_fits():
    """A 2 ms budget (the flood tests' server): once K is measured, not even the lightest load fits, and light
    traffic after it does not reopen the floor."""
    clock = Clock()
    adm = Admission(delay_budget_ms=2, clock=clock, rng=random.Random(1))
    feed(adm, clock, 2, lambda d: 0.005, 6, k=4.0)
    adm.active.clear()
    adm.live.clear()
    light(adm, clock, [100], cycle=0.005, seconds=10)
    e = adm.current()
    assert e.max_demand_rows_s == 0 and e.capacity == 0
    assert adm.admit() is not None                                  # one live: the second is refused


def test_capacity_from_measurements_matches_the_engine_it_measures():
    clock = Clock()
    adm = Admission(clock=clock, rng=random.Random(1))
    best = true_capacity()                                      # 159 streams
    feed(adm, clock, 100, linear_cycle, 20)
    e = adm.current()
    assert e.state == "measured" and e.rows_per_stream_s == pytest.approx(9.0, rel=0.1)
    assert e.delay_in_cycles == pytest.approx(15, rel=0.15)
    # measured up to 100 streams: beyond, no batching gain is assumed, so it stays below the truth
    assert 100 < e.capacity <= best
    assert e.streams == e.capacity - 100
    adm.active.clear()
    adm.live.clear()
    for n in (130, 160, 200):                                   # loads up to past the truth measured too
        feed(adm, clock, n, linear_cycle, 15, start_id=10_000 * n)
        adm.active.clear()
        adm.live.clear()
    feed(adm, clock, 120, linear_cycle, 15, start_id=1)
    assert adm.current().capacity == pytest.approx(best, rel=0.08)


def test_refuses_beyond_capacity_and_takes_again_when_streams_leave():
    clock = Clock()
    adm = Admission(clock=clock, rng=random.Random(1))
    feed(adm, clock, 100, linear_cycle, 20)
    cap = adm.cap
    admitted = 0
    while adm.admit() is None:
        adm.admitted(1000 + admitted)
        admitted += 1
        assert admitted < 1000
    assert admitted == cap - 100 and adm.headroom() == 0
    wait = adm.admit()
    assert 1.0 <= wait <= 30.0
    adm.released(1000)                                          # one leaves: its share is free at once
    assert adm.admit() is None


def test_over_budget_admits_nobody_until_the_delay_is_back():
    clock = Clock()
    adm = Admission(clock=clock, rng=random.Random(1))
    feed(adm, clock, 50, linear_cycle, 20)
    assert adm.headroom() > 0
    lags = [150.0] * GUARD_WORDS                                # 150 ms, over the 100 ms budget
    adm.job(10, 0.004, lags)
    adm.refresh([(i, 10_000) for i in range(50)])
    e = adm.current()
    assert e.state == "over_budget" and e.p99_ms > 100 and e.streams == 0
    assert adm.admit() is not None
    feed(adm, clock, 50, linear_cycle, 8)                       # the window forgets the slow words
    assert adm.current().state == "measured" and adm.admit() is None


def test_a_quiet_stream_frees_its_share_and_takes_it_back_when_it_speaks():
    clock = Clock()
    adm = Admission(quiet_s=10.0, clock=clock, rng=random.Random(1))
    adm.admitted(1)
    adm.admitted(2)
    adm.refresh([(1, 0), (2, 0)])
    assert adm.current().live == 2                              # just admitted: live although silent
    for words in range(1, 50):                                  # stream 1 speaks, stream 2 stays silent
        clock.t += 0.25
        adm.refresh([(1, words), (2, 0)])
    assert adm.live == {1}
    clock.t += 0.25
    adm.refresh([(1, 49), (2, 1)])                              # it speaks again: live again
    assert adm.live == {1, 2}


def test_retry_after_is_spread_and_bounded():
    clock = Clock()
    adm = Admission(retry_max_s=30.0, clock=clock, rng=random.Random(3))
    feed(adm, clock, 100, linear_cycle, 20)
    for i in range(adm.cap):
        adm.admitted(10_000 + i)
    waits = [adm.admit() for _ in range(200)]
    assert all(w is not None and 1.0 <= w <= 30.0 for w in waits)
    assert max(waits) - min(waits) > 10                         # spread: they do not come back together
    short = Admission(retry_max_s=0.5, clock=clock, rng=random.Random(3))
    for sid in range(COLD_STREAMS):
        short.admitted(sid)
    assert all(0.25 <= short.admit() <= 0.5 for _ in range(20))


def test_a_refusal_not_recorded_leaves_retry_after_as_it_was():
    """--engines: a stream refused by one engine and tried on the next is no refused client (record=False):
    the refusals that retry_after spreads over the freed shares count only the clients that heard it."""
    clock = Clock()
    adm = Admission(retry_max_s=30.0, clock=clock, rng=random.Random(3))
    feed(adm, clock, 100, linear_cycle, 20)
    for i in range(adm.cap):
        adm.admitted(10_000 + i)
    assert adm.admit(record=False) is not None and len(adm.refusals) == 0   # refused all the same
    assert adm.admit() is not None and len(adm.refusals) == 1


def test_disabled_admits_everyone_and_still_estimates():
    clock = Clock()
    adm = Admission(enabled=False, clock=clock)
    feed(adm, clock, 300, linear_cycle, 20)
    assert adm.admit() is None
    e = adm.current()
    assert e.capacity < 300 and e.state == "over_budget" and e.streams == 0


# ---------------------------------------------------------------- a real server, flooded
SENTENCES = [s for s, _ in make_pairs(24, min_len=3, max_len=7, seed=46)]


async def one_stream(url: str, sentences: list[str], *, retry_cap: float | None = None, deadline: float = 0):
    """Start (retrying server_busy after min(retry_after, retry_cap) until `deadline`), send the sentences
    whole, end; (the messages of the admitted stream, the server_busy refusals it got)."""
    refusals = []
    while True:
        ws = await connect(url, max_size=2 ** 22)
        await ws.send(json.dumps({"type": "start", "model": "gma", "id": "s"}))
        first = json.loads(await ws.recv())
        if first["type"] == "ready":
            break
        try:
            await ws.recv()
        except ConnectionClosed:
            pass
        refusals.append((first, ws.close_code))
        await ws.close()
        if first.get("code") != "server_busy" or retry_cap is None or time.monotonic() > deadline:
            return None, refusals
        await asyncio.sleep(min(first["retry_after"], retry_cap))
    received = [first]
    for s in sentences:
        await ws.send(json.dumps({"type": "words", "words": s.split()}))
        await ws.send(json.dumps({"type": "end_sentence"}))
    await ws.send(json.dumps({"type": "end_stream"}))
    try:
        async for raw in ws:
            received.append(json.loads(raw))
    except ConnectionClosed:
        pass
    return (received, ws.close_code), refusals


def words_of(received) -> list[tuple]:
    return [(m["sentence"], m["index"], m["text"], m["delay"]) for m in received if m["type"] == "word"]


class HealthPoller(threading.Thread):
    """GET /health every 50 ms until stopped: status codes, slowest answer, the headroom each reported."""

    def __init__(self, base: str):
        super().__init__(daemon=True)
        self.base, self.stop, self.codes, self.slowest, self.headroom = base, threading.Event(), [], 0.0, []

    def run(self):
        with httpx.Client(timeout=10) as client:
            while not self.stop.is_set():
                t = time.monotonic()
                try:
                    r = client.get(self.base + "/health")
                    self.codes.append(r.status_code)
                    self.headroom.append(r.json()["headroom"])
                except httpx.HTTPError as e:
                    self.codes.append(repr(e))
                self.slowest = max(self.slowest, time.monotonic() - t)
                self.stop.wait(0.05)


@pytest.fixture(scope="module")
def flood_server(trained, one_torch_thread):
    # a 2 ms budget: the tiny model's p99 is over it even alone, so the estimate keeps one stream at a time
    with LiveServer(models={"gma": str(trained["gma"])}, admission=True, delay_budget_ms=2, admission_retry_max_s=0.5,
                    max_connections_per_ip=0, memory_trim_s=0.5) as srv:
        yield srv


def test_flood_admitted_streams_complete_unchanged_refused_get_server_busy(flood_server):
    srv, n = flood_server, 24
    jobs = [SENTENCES[i % 6: i % 6 + 3] for i in range(n)]
    idle = {}
    for sents in {tuple(j) for j in jobs}:                     # each job alone on the idle server: the reference
        # (the stream before may not have left the server yet when its client saw the close: retry)
        (received, code), _ = asyncio.run(one_stream(srv.url, list(sents), retry_cap=0.5,
                                                     deadline=time.monotonic() + 10))
        assert code == 1000
        idle[sents] = words_of(received)
    deadline = time.monotonic() + 5                            # the idle runs measured: the estimate decides
    while httpx.get(srv.http + "/health").json()["headroom"]["models"]["gma"]["state"] == "cold":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    rss_before = srv.metric("process_resident_memory_bytes")
    health = HealthPoller(srv.http)
    health.start()

    async def flood():
        deadline = time.monotonic() + 60
        return await asyncio.gather(*(one_stream(srv.url, j, retry_cap=0.5, deadline=deadline) for j in jobs))
    try:
        results = asyncio.run(flood())
    finally:
        health.stop.set()
        health.join(10)
    refused = [r for _, rs in results for r in rs]
    assert refused, "a 2 ms budget must refuse most of a flood"
    for msg, close in refused:                                 # typed, retryable, before any word
        server_adapter.validate_python(msg)
        assert msg["code"] == "server_busy" and msg["fatal"] and msg["id"] == "s"
        assert 0 < msg["retry_after"] <= 0.5 and close == ERRORS["server_busy"][1] == 1013
    for job, (done, _) in zip(jobs, results):                  # every client got in on retry, none dropped
        assert done is not None, "a refused client was never admitted"
        received, code = done
        assert code == 1000 and received[-1]["type"] == "end"
        assert not [m for m in received if m["type"] == "error"]
        assert words_of(received) == idle[tuple(job)]
    assert health.codes and set(health.codes) == {200}, health.codes[:5]
    assert health.slowest < 2.0
    model = [h["models"]["gma"] for h in health.headroom]
    assert {"streams", "capacity", "live", "p99_ms", "state"} <= set(model[0])
    assert {h["state"] for h in model} <= {"measured", "over_budget"}   # refused by the estimate, not cold
    # one at a time (one leaving, one let in) in each engine process: /health adds up their live streams
    assert max(h["live"] for h in model) <= 3 * srv.engines
    # everything comes back: gauges, cache slots, memory
    assert srv.wait_metric("simulserve_model_streams", 0, model="gma") == 0
    assert srv.wait_metric("simulserve_cache_slots_in_use", 0, model="gma") == 0
    deadline = time.monotonic() + 10
    while (rss := srv.metric("process_resident_memory_bytes")) > rss_before * 1.1 + 20e6 \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    assert rss <= rss_before * 1.1 + 20e6, (rss_before / 2**20, rss / 2**20)
    assert srv.metric("simulserve_errors_total", code="server_busy") >= len(refused)
    assert srv.metric("simulserve_headroom_streams", model="gma") >= 0


def test_stream_client_waits_out_server_busy_then_streams(flood_server):
    from clients.stream import ClientError, stream_lines
    srv = flood_server

    async def main():
        holder = await connect(srv.url)                        # holds the one share the budget allows
        await holder.send(json.dumps({"type": "start", "model": "gma"}))
        assert json.loads(await holder.recv())["type"] == "ready"
        notes = []
        with pytest.raises(ClientError) as e:                  # busy for longer than it may wait
            await stream_lines(srv.url, ["a b c"], model="gma", wpm=0, busy_wait=0.6, warn=notes.append)
        assert e.value.exit_code == 3 and "server_busy" in str(e.value)
        assert any("busy" in n for n in notes)
        later = asyncio.create_task(stream_lines(srv.url, SENTENCES[:2], model="gma", wpm=0, busy_wait=30,
                                                 warn=notes.append))
        await asyncio.sleep(1.0)
        await holder.close()                                   # the share frees: the client gets in on retry
        return await asyncio.wait_for(later, 30), notes
    summary, notes = asyncio.run(main())
    assert [s["source"] for s in summary.sentences] == SENTENCES[:2]
    assert not summary.errors


def test_bench_counts_admitted_refused_and_waits(flood_server, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    src = tmp_path / "source.txt"
    src.write_text("\n".join(SENTENCES[:6]) + "\n")
    out = tmp_path / "bench.json"
    # the estimate must have measured a stream (it admits freely while cold): alone, this test would see none
    asyncio.run(one_stream(flood_server.url, SENTENCES[:2], retry_cap=0.5, deadline=time.monotonic() + 10))
    deadline = time.monotonic() + 5
    while httpx.get(flood_server.http + "/health").json()["headroom"]["models"]["gma"]["state"] == "cold":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    r = subprocess.run([sys.executable, "-m", "clients.cli", "bench", "server", "--url", flood_server.url, "--model",
                        "gma", "--input", str(src), "--levels", "3", "--overload", "5", "--level-seconds", "3",
                        "--min-words", "0", "--wpm", "300", "--max-p99-ms", "1000000", "--skip", "throughput,soak",
                        "--json", str(out)],
                       cwd=root, env={**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "admission by headroom (refused speakers try again after the server's retry_after)" in r.stdout
    fig = json.loads(out.read_text())
    for level in fig["ramp"] + fig["overload"]:
        # one stream at a time: the rest are refused, typed, and wait (server_busy is not an error)
        assert level["admitted"] >= 1 and level["refused"] >= 1 and not level["errors"], level
        assert level["admitted"] + level["still_waiting"] >= level["streams"]
        assert level["health_polls"] >= 2 and level["health_failures"] == 0
        assert level["words_out"] > 0
