"""Overlapped jobs: a step launched before the step before it is collected (server/engine.py `overlap`, the
default on a CUDA device, where the host's per-stream work then runs while the device computes).

The decoder's two halves (`StreamingDecoder.launch`, `collect`), interleaved over two groups of streams and
collected in either order, write exactly what `step` writes; a stream in flight cannot be launched again; a real
server with overlap forced on (on the CPU) writes what each stream writes alone, and its jobs did overlap."""
from __future__ import annotations

import asyncio

import httpx
import pytest
from conftest import POLICIES, random_decoder
from test_server import LiveServer, assert_matches, codes, make_reference, sentence_messages, talk
from test_server import test_bad_input_gets_codes_and_other_streams_carry_on as bad_input
from test_server import test_disconnect_mid_sentence_frees_the_stream as disconnect
from test_server import test_fifty_concurrent_streams as fifty
from test_server import test_stream_equals_translate as equals_translate
from test_streaming_equivalence import SENTENCES
from test_workers import WorkersServer

from models.step import StreamingDecoder
from models.stream import StreamError


def run_two_groups(dec, sentences: list[str], interleave: bool) -> list[tuple]:
    """Streams in two groups, fed a word every other round out of phase; each round steps group A, then group B.
    interleave: B is launched while A is in flight, and the two are collected in turn in either order."""
    streams = [dec.new_stream() for _ in sentences]
    words = [s.split() for s in sentences]
    fed = [0] * len(streams)
    groups = [streams[0::2], streams[1::2]]
    for n in range(400):
        for i, s in enumerate(streams):
            if fed[i] < len(words[i]) and (n + i) % 2 == 0:
                dec.push(s, [words[i][fed[i]]])
                fed[i] += 1
                if fed[i] == len(words[i]):
                    dec.finish(s)
        if all(s.done for s in streams):
            break
        live = [[s for s in g if not s.done] for g in groups]
        if interleave:
            a, b = dec.launch(live[0]), dec.launch(live[1])
            assert all(s.in_flight for s, o in zip(live[0], a.out) if o is None)   # the decoder decides those
            outs = [dec.collect(b), dec.collect(a)] if n % 2 else [dec.collect(a), dec.collect(b)]
            assert all(o is not None for out in outs for o in out) and not any(s.in_flight for s in streams)
        else:
            dec.step(live[0])
            dec.step(live[1])
    assert all(s.done for s in streams)
    out = [(s.target_tokens, s.token_delays, [w.text for w in s.words]) for s in streams]
    for s in streams:
        dec.close(s)
    return out


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("form", ["default", "graphs-encoder"])
def test_interleaved_launches_write_what_steps_write(piece_tok, policy, form, one_torch_thread):
    """The graphs form too: its padding rows of two launches share the scratch slot, and on a GPU both steps
    replay the same graphs' buffers (in the stream's order)."""
    plain = random_decoder(piece_tok, policy, seed=3)
    dec = StreamingDecoder(plain.model, plain.tok, form=form)
    if dec.form.graphs:
        dec.capture_graphs(capacity=12, max_batch=8)
    stepped = run_two_groups(plain, SENTENCES, interleave=False)
    assert run_two_groups(dec, SENTENCES, interleave=True) == stepped
    assert any(tokens for tokens, _, _ in stepped)   # (the untrained model writes something)


def test_a_stream_in_flight_cannot_be_launched_again(piece_tok):
    dec = random_decoder(piece_tok, "waitk")
    s = dec.new_stream(k=1)
    dec.push(s, SENTENCES[0].split()[:2])
    dec.step([s])                      # reads
    p = dec.launch([s])
    assert s.in_flight
    with pytest.raises(StreamError, match="launched and not yet collected"):
        dec.launch([s])
    dec.collect(p)
    assert not s.in_flight
    dec.step([s])                      # free again


class TestOverlapServer:
    """test_server.py's equivalence tests against a real server whose engine overlaps its jobs on the CPU. Jobs of
    at most 8 streams: with more streams moving than a job takes, the next job is always launched while one is in
    flight (with room for all of them, every stream could be in the one job in flight, and nothing overlaps)."""
    server_class = LiveServer

    @pytest.fixture(scope="class")
    @classmethod
    def server(cls, trained):
        with cls.server_class(models={p: str(path) for p, path in trained.items()}, rate_limit=10000,
                              rate_burst=10000, overlap="on", max_batch=8) as srv:
            yield srv

    @pytest.fixture(scope="class")
    @classmethod
    def reference(cls, trained):
        return make_reference(trained)

    test_stream_equals_translate = staticmethod(equals_translate)
    test_fifty_concurrent_streams = staticmethod(fifty)
    test_bad_input_gets_codes_and_other_streams_carry_on = staticmethod(bad_input)
    test_disconnect_mid_sentence_frees_the_stream = staticmethod(disconnect)

    def test_jobs_overlap_and_the_setting_is_reported(self, server):
        """Twenty streams at once on one model, jobs of at most 8: jobs are launched while the job before is in
        flight."""
        def overlapped() -> int:
            models = {m["name"]: m for m in httpx.get(server.http + "/v1/models").json()["models"]}
            assert all(m["batching"]["overlap"] is True for m in models.values())
            return models["gma"]["batching"]["overlapped_jobs"]
        before = overlapped()

        async def main():
            return await asyncio.gather(*[
                talk(server.url, [{"type": "start", "model": "gma"}] + sentence_messages(SENTENCES)
                     + [{"type": "end_stream"}], timeout=120) for _ in range(20)])
        for received, code in asyncio.run(main()):
            assert code == 1000 and [m["type"] for m in received].count("sentence") == len(SENTENCES)
        assert overlapped() > before


class TestOverlapWorkers(TestOverlapServer):
    """The same against `simulserve serve --workers 2` with overlap on: the CUDA default's shape (front ends in
    processes of their own, one engine process), here on the CPU."""
    server_class = WorkersServer


def test_overlap_is_off_on_the_cpu_by_default(trained):
    with LiveServer(models={"waitk": str(trained["waitk"])}) as srv:
        eng = srv.app.state.server.engines["waitk"]
        assert eng.overlap is False and eng.info()["batching"]["overlap"] is False


@pytest.mark.parametrize("overlap", ["on", "off"])
@pytest.mark.parametrize("half", ["launch", "collect"])
def test_a_failed_step_closes_its_streams_and_the_engine_goes_on(trained, overlap, half):
    """A step that raises in either half (with and without overlap): each stream in it gets `internal_error` (fatal:
    its websocket closes with 1011), its cache slot is freed, nothing is left in flight, and streams after it are
    translated as one stream alone translates them."""
    reference = make_reference(trained)
    sentences = SENTENCES[:3]
    with LiveServer(models={"gma": str(trained["gma"])}, overlap=overlap, rate_limit=10000,
                    rate_burst=10000) as srv:
        eng = srv.app.state.server.engines["gma"]
        real = getattr(eng.dec, half)
        armed = [1]

        def failing(*a, **k):
            if armed[0]:
                armed[0] -= 1
                raise RuntimeError("injected")
            return real(*a, **k)
        setattr(eng.dec, half, failing)
        failed, code = asyncio.run(talk(srv.url, [{"type": "start", "model": "gma"}, {"type": "words",
                                                  "words": sentences[0].split()}, {"type": "end_stream"}]))
        assert code == 1011 and codes(failed) == ["internal_error"] and armed == [0], failed
        assert not any(h.in_flight for h in eng.handles.values())
        assert srv.wait_metric("simulserve_cache_slots_in_use", 0, model="gma") == 0   # its slot was freed
        received, code = asyncio.run(talk(srv.url, [{"type": "start", "model": "gma"}] + sentence_messages(sentences)
                                          + [{"type": "end_stream"}]))
        assert code == 1000
        assert_matches(received, [reference("gma", {}, s) for s in sentences])
