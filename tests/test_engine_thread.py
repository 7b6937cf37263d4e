"""The engine's stepping loop runs on a thread of its own: every use of the decoder (warm-up, steps,
freeing a closed stream, shrinking the cache) happens on that one thread, the event loop never steps,
and streams still receive exactly what the single-stream computation writes."""
from __future__ import annotations

import asyncio
import json
import threading

import torch

from test_server import LiveServer, assert_matches, connect, sentence_messages, talk
from test_streaming_equivalence import SENTENCES

from models.translate import simulate


def spy_on_the_decoder(engine, modes: list | None = None) -> list[str]:
    """Record the thread of every call that reads or changes the decoder's state (and in `modes`, each call's
    name and whether the caller was in torch's inference mode)."""
    names: list[str] = []
    dec = engine.dec
    for attr in ("step", "launch", "collect", "new_stream", "close", "push", "finish"):
        real = getattr(dec, attr)

        def spy(*a, _real=real, _attr=attr, **k):
            names.append(threading.current_thread().name)
            if modes is not None:
                modes.append((_attr, torch.is_inference_mode_enabled()))
            return _real(*a, **k)
        setattr(dec, attr, spy)
    real_shrink = dec.pool.shrink

    def shrink():
        names.append(threading.current_thread().name)
        if modes is not None:
            modes.append(("shrink", torch.is_inference_mode_enabled()))
        return real_shrink()
    dec.pool.shrink = shrink
    return names


def test_only_the_engine_thread_touches_the_decoder(trained, trained_decoders):
    with LiveServer(models={"gma": str(trained["gma"])}, warmup=False, rate_limit=10000,
                    rate_burst=10000) as srv:
        engine = srv.app.state.server.engines["gma"]
        modes = []
        names = spy_on_the_decoder(engine, modes)
        loop_thread = srv.thread.name

        async def main():
            streams = [talk(srv.url, [{"type": "start", "model": "gma", "delta": d}] + sentence_messages(SENTENCES[:3])
                            + [{"type": "end_stream"}], timeout=120) for d in (0.5, 1.0, 2.0)]
            done = await asyncio.gather(*streams)
            ws = await connect(srv.url)             # a stream that leaves mid-sentence: its slot is freed
            await ws.send(json.dumps({"type": "start", "model": "gma"}))
            await ws.send(json.dumps({"type": "words", "words": SENTENCES[0].split()[:3]}))
            assert json.loads(await ws.recv())["type"] == "ready"
            await ws.close()
            return done
        results = asyncio.run(main())
        assert srv.wait_metric("simulserve_cache_slots_in_use", 0, model="gma") == 0
        engine.warmup()                                           # asked from this (test) thread
        asyncio.run_coroutine_threadsafe(engine.shrink_cache(), engine._loop).result(30)
    assert names and set(names) == {f"engine-{engine.name}"}, set(names)
    # the stepping loop runs in inference mode once (each launch and collect then skips entering it); the calls
    # handed to the thread (warm-up, shrinking the cache) run outside it
    stepping = {mode for name, mode in modes if name in ("launch", "collect")}
    assert stepping == {True} and {mode for name, mode in modes if name == "shrink"} == {False}, modes
    assert loop_thread not in names
    dec = trained_decoders["gma"]
    for (received, code), d in zip(results, (0.5, 1.0, 2.0)):
        assert code == 1000
        assert_matches(received, [simulate(dec, [s], batch_size=1, delta=d)[0] for s in SENTENCES[:3]], f"δ {d}")


def test_a_job_looks_only_at_streams_that_may_move(trained, trained_decoders):
    """Idle open streams leave the runnable set and are not looked at by the next jobs; a stream that gets
    words comes back (no wake-up lost), and each stream still writes what it writes alone."""
    with LiveServer(models={"gma": str(trained["gma"])}, rate_limit=10000, rate_burst=10000) as srv:
        engine = srv.app.state.server.engines["gma"]

        async def main():
            idle = [await connect(srv.url) for _ in range(6)]
            for ws in idle:                        # started, no words: nothing for the engine to do
                await ws.send(json.dumps({"type": "start", "model": "gma"}))
                assert json.loads(await ws.recv())["type"] == "ready"
            await asyncio.sleep(0.2)
            looked_at_while_idle = len(engine._runnable.ids())
            busy = await talk(srv.url, [{"type": "start", "model": "gma"}] + sentence_messages(SENTENCES[:2])
                              + [{"type": "end_stream"}], timeout=60)
            runnable_after = engine._runnable.ids()
            for ws in idle:
                await ws.close()
            return looked_at_while_idle, busy, runnable_after, {h for h in engine.handles}
        idle_runnable, (received, code), runnable_after, handles = asyncio.run(main())
    assert code == 1000
    assert idle_runnable == 0          # six open streams, none of them in the set a job scans
    assert len(runnable_after) <= 1    # the finished stream at most, until the next job drops it
    assert_matches(received, simulate(trained_decoders["gma"], SENTENCES[:2]))
