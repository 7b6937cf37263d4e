"""The engine's scheduling: one step per job streams what `translate` writes, nothing starves, and the
server's queueing is measured (real uvicorn servers, real websocket clients, tiny models)."""
from __future__ import annotations

import asyncio

import pytest
from test_server import (LiveServer, SETTINGS, assert_matches, check_stream_equals_translate,  # noqa: F401
                         reference, talk)

from models.data.synthetic import make_pairs
from server.bench import histogram_quantile


def test_one_step_per_job_streams_the_same_and_queueing_is_measured(trained, reference):
    """Every job steps each stream that can move once, sentence tails included: streamed words and
    delays equal `simulserve translate`, and the time streams wait for their job is measured."""
    with LiveServer(models={p: str(path) for p, path in trained.items()},
                    rate_limit=10000, rate_burst=10000) as srv:
        for policy in SETTINGS:
            check_stream_equals_translate(srv.url, policy, reference)
        assert srv.metric("simulserve_queue_seconds_count", model="gma") > 0
        assert srv.metric("simulserve_step_seconds_count", model="gma") > 0
        for policy in SETTINGS:   # one lag observed a word emitted (a job's lags go in at once: observe_many)
            words = srv.metric("simulserve_target_words_total", model=policy)
            assert words > 0 and srv.metric("simulserve_word_lag_seconds_count", model=policy) == words


def test_a_flood_of_words_does_not_starve_a_quiet_speaker(trained, reference):
    """One client sends 150 sentences at once; a second speaks one word every 20 ms beside it. The
    quiet speaker's sentence is translated as if alone and finishes long before the flood does:
    every job steps every stream that can move, once (default settings)."""
    flood = [s for s, _ in make_pairs(150, min_len=6, max_len=9, seed=31)]
    quiet = [s for s, _ in make_pairs(1, min_len=8, max_len=9, seed=32)]
    with LiveServer(models={"waitk": str(trained["waitk"])}, rate_limit=100000, rate_burst=100000,
                    max_backlog_words=100000) as srv:
        async def main():
            done = {}

            async def timed(name, coro):
                out = await coro
                done[name] = asyncio.get_running_loop().time()
                return out
            flood_msgs = [{"type": "start", "model": "waitk"}]
            for s in flood:
                flood_msgs += [{"type": "words", "words": s.split()}, {"type": "end_sentence"}]
            quiet_msgs = [{"type": "start", "model": "waitk"}] + \
                [{"type": "words", "words": [w]} for w in quiet[0].split()] + [{"type": "end_stream"}]
            flooding = asyncio.create_task(timed("flood", talk(srv.url, flood_msgs + [{"type": "end_stream"}],
                                                             timeout=300)))
            await asyncio.sleep(0.2)   # the flood is queued first
            speaking = await timed("quiet", talk(srv.url, quiet_msgs, pace=lambda: 0.02, timeout=300))
            return speaking, await flooding, done
        (quiet_got, code), (flood_got, flood_code), done = asyncio.run(main())
    assert code == 1000 and flood_code == 1000
    assert done["quiet"] < done["flood"]
    assert_matches(quiet_got, [reference("waitk", {}, quiet[0])], "quiet")
    assert sum(m["type"] == "sentence" for m in flood_got) == len(flood)
    # while the flood was being translated, each of the quiet speaker's words came within a few
    # jobs of its input (a starved stream would wait for the flood's whole backlog: seconds)
    flood_ms = 1000 * (done["flood"] - done["quiet"])
    lags = [m["lag_ms"] for m in quiet_got if m["type"] == "word"]
    assert max(lags) < max(500.0, flood_ms / 4), (lags, flood_ms)


def test_histogram_quantile_reads_prometheus_buckets():
    def scrape(counts):
        out = {f'simulserve_queue_seconds_bucket{{le="{le}",model="m"}}': c for le, c in counts}
        return out
    before = scrape([("0.001", 0), ("0.01", 0), ("0.1", 0), ("+Inf", 0)])
    after = scrape([("0.001", 50), ("0.01", 90), ("0.1", 100), ("+Inf", 100)])
    q = lambda x: histogram_quantile(before, after, "simulserve_queue_seconds", "m", x)  # noqa: E731
    assert q(0.5) == pytest.approx(0.001)
    assert q(0.7) == pytest.approx(0.001 + 0.009 * 20 / 40)
    assert q(0.99) == pytest.approx(0.01 + 0.09 * 9 / 10)
    assert histogram_quantile(after, after, "simulserve_queue_seconds", "m", 0.99) != \
        histogram_quantile(after, after, "simulserve_queue_seconds", "m", 0.99)   # nothing observed: nan
