"""Limits and safety of the server: API key, origins, server full, idle timeout, floods, backlog, sizes.

Each refusal carries its documented code (and close code for fatal ones), and a
good stream running alongside keeps its exact output.
"""
from __future__ import annotations

import asyncio
import json

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from models.data.synthetic import make_pairs
from server.protocol import ERRORS
from test_server import LiveServer, assert_matches, codes, make_reference, sentence_messages, talk

KEY = "s3cret-key"
START = {"type": "start", "model": "waitk", "k": 2}
TAIL = [{"type": "words", "words": ["haus", "baum"]}, {"type": "end_stream"}]


@pytest.fixture(scope="module")
def reference(trained):
    return make_reference(trained)


@pytest.fixture(scope="module")
def server(trained):
    with LiveServer(models={"waitk": str(trained["waitk"])}, api_keys=[KEY], max_streams=8,
                    allowed_origins=["http://good.example"], idle_timeout_s=2.0, rate_limit=20, rate_burst=20,
                    max_message_bytes=512, max_backlog_words=8, max_words_per_sentence=6) as srv:
        srv.auth = {"additional_headers": {"Authorization": f"Bearer {KEY}"}}
        yield srv


def fatal(received, close_code, expected):
    assert codes(received) == [expected], received
    assert received[-1]["fatal"] is True
    assert close_code == ERRORS[expected][1]


def test_api_key_paths(server):
    async def main():
        return await asyncio.gather(
            talk(server.url, [START] + TAIL),                                             # no key
            talk(server.url, [START] + TAIL, additional_headers={"Authorization": "Bearer wrong"}),
            talk(server.url + "?token=wrong", [START] + TAIL),
            talk(server.url, [START] + TAIL, **server.auth),                              # Bearer header
            talk(server.url + f"?token={KEY}", [START] + TAIL))                           # ?token=

    r = asyncio.run(main())
    for received, close_code in r[:3]:
        fatal(received, close_code, "unauthorized")
    for received, close_code in r[3:]:
        assert close_code == 1000 and not codes(received) and received[-1]["type"] == "end"


def test_allowed_origins(server):
    async def main():
        return await asyncio.gather(
            talk(server.url, [START] + TAIL, origin="http://evil.example", **server.auth),
            talk(server.url, [START] + TAIL, origin="http://good.example", **server.auth))

    (bad, bad_code), (good, good_code) = asyncio.run(main())
    fatal(bad, bad_code, "origin_not_allowed")
    assert good_code == 1000 and good[-1]["type"] == "end"


def test_server_full_then_a_slot_frees(server):
    async def main():
        held = []
        for _ in range(8):
            ws = await connect(server.url, **server.auth)
            await ws.send(json.dumps(START))
            json.loads(await ws.recv())
            held.append(ws)
        full = await talk(server.url, [START] + TAIL, **server.auth)
        await held.pop().close()
        server.wait_metric("simulserve_active_streams", 7)
        again = await talk(server.url, [START] + TAIL, **server.auth)
        for ws in held:
            await ws.close()
        return full, again

    (full, full_code), (again, again_code) = asyncio.run(main())
    fatal(full, full_code, "server_full")
    assert again_code == 1000 and again[-1]["type"] == "end"


def test_idle_timeout(server):
    received, close_code = asyncio.run(talk(server.url, [START], **server.auth))  # then silence
    assert received[0]["type"] == "ready"
    fatal(received, close_code, "idle_timeout")


def test_idle_timeout_mid_sentence_translates_the_open_sentence_first(server, reference):
    """A speaker who stops mid-sentence (no end_sentence, a word cut at the end of a text chunk): at the idle
    timeout its words are translated as that sentence alone, sent, and only then the stream is closed."""
    idle = server.metric("simulserve_sentence_ends_total", cause="idle")
    received, close_code = asyncio.run(talk(server.url, [START, {"type": "words", "words": ["haus", "baum"]},
                                                         {"type": "text", "text": "licht wa"}], **server.auth))
    assert [m["type"] for m in received][-2:] == ["sentence", "error"]
    fatal(received, close_code, "idle_timeout")
    want = reference("waitk", {"k": 2}, "haus baum licht wa")
    assert received[-2]["source"] == "haus baum licht wa" and received[-2]["translation"] == want.prediction
    assert [m["text"] for m in received if m["type"] == "word"] == want.prediction.split()
    # the cut word would take the sentence past max_words_per_sentence (6): the six are translated, it is not
    six = "haus baum licht wald mond sonne".split()
    received, close_code = asyncio.run(talk(server.url, [START, {"type": "words", "words": six},
                                                         {"type": "text", "text": " haus"}], **server.auth))
    fatal(received, close_code, "idle_timeout")
    assert received[-2]["translation"] == reference("waitk", {"k": 2}, " ".join(six)).prediction
    assert server.metric("simulserve_sentence_ends_total", cause="idle") - idle == 2   # (/metrics: by cause)


def test_a_pause_ends_the_open_sentence_and_the_stream_goes_on(server, reference):
    """start's end_after_pause_s: after words with no sentence end, a pause that long ends the sentence, and its
    words are translated as that sentence alone while the stream stays open (a word cut at the end of a text
    chunk counts as complete); the next words open a new sentence. Without the setting nothing ends before the
    stream does. Each pause here (0.8 s) is under the fixture's idle_timeout (2 s) and over the setting (0.3 s)."""
    messages = [{"type": "words", "words": ["haus", "baum"]}, {"type": "text", "text": "licht wa"},
                {"type": "words", "words": ["mond"]}, {"type": "end_stream"}]

    def run(start):
        gaps = iter([0.05, 0.8, 0.8, 0.05, 0.05])
        return asyncio.run(talk(server.url, [start, *messages], pace=lambda: next(gaps), **server.auth))

    def ends(cause):
        return server.metric("simulserve_sentence_ends_total", cause=cause)

    before = {c: ends(c) for c in ("pause", "end")}
    received, code = run({**START, "end_after_pause_s": 0.3})
    assert code == 1000 and not codes(received) and received[0]["end_after_pause_s"] == 0.3
    pieces = ["haus baum", "licht wa", "mond"]
    sentences = [m for m in received if m["type"] == "sentence"]
    assert [m["source"] for m in sentences] == pieces
    assert [m["translation"] for m in sentences] == [reference("waitk", {"k": 2}, p).prediction for p in pieces]
    received, code = run(START)
    assert code == 1000 and received[0]["end_after_pause_s"] is None
    assert [m["source"] for m in received if m["type"] == "sentence"] == ["haus baum licht wa mond"]
    # /metrics counts the ends by cause: two pauses, and end_stream's end of each run
    assert (ends("pause") - before["pause"], ends("end") - before["end"]) == (2, 2)
    # the cut word would take the sentence past max_words_per_sentence (6): the six are ended at the pause, and
    # the cut word, kept, opens the next sentence with the next message's words
    six = "haus baum licht wald mond sonne".split()
    gaps = iter([0.05, 0.05, 0.8, 0.05, 0.05])
    received, code = asyncio.run(talk(server.url, [{**START, "end_after_pause_s": 0.3},
                                                   {"type": "words", "words": six}, {"type": "text", "text": " hau"},
                                                   {"type": "words", "words": ["baum"]}, {"type": "end_stream"}],
                                      pace=lambda: next(gaps), **server.auth))
    assert code == 1000 and not codes(received)
    assert [m["source"] for m in received if m["type"] == "sentence"] == [" ".join(six), "hau baum"]
    for bad in (0, -1, 3601, "1", True):
        refused, code = asyncio.run(talk(server.url, [{**START, "end_after_pause_s": bad}, START,
                                                      {"type": "end_stream"}], **server.auth))
        assert codes(refused) == ["bad_message"] and "end_after_pause_s" in refused[0]["message"], bad
        assert code == 1000     # (not fatal: the good start that followed opened the stream)


def test_flood_backlog_and_sizes_while_a_good_stream_carries_on(server, reference):
    sentences = [s for s, _ in make_pairs(4, min_len=2, max_len=6, seed=41)]
    good = [START] + sentence_messages(sentences) + [{"type": "end_stream"}]

    async def oversized_frame():
        """A frame over 4x max_message_bytes is refused by the websocket layer itself (1009)."""
        async with connect(server.url, **server.auth) as ws:
            await ws.send(json.dumps(START))
            await ws.recv()
            await ws.send(json.dumps({"type": "text", "text": "x" * 5000}))
            try:
                while True:
                    await ws.recv()
            except ConnectionClosed:
                return ws.close_code

    async def main():
        return await asyncio.gather(
            talk(server.url, good, pace=lambda: 0.06, **server.auth),
            talk(server.url, [START] + [{"type": "end_sentence"}] * 100, **server.auth),      # flood
            talk(server.url, [START, {"type": "words", "words": ["haus"] * 9}] + TAIL, **server.auth),   # > backlog
            talk(server.url, [START, {"type": "words", "words": ["haus"] * 5}, {"type": "end_sentence"},
                              {"type": "end_stream"}], **server.auth),                                    # slow_down
            talk(server.url, [START, {"type": "words", "words": ["haus"] * 7}] + TAIL, **server.auth),   # > 6 words
            talk(server.url, [START, json.dumps({"type": "text", "text": "y" * 600})] + TAIL, **server.auth),
            oversized_frame())

    (good_r, good_code), flood, backlog, slow, too_long, large, frame_code = asyncio.run(main())
    assert good_code == 1000 and not codes(good_r)
    assert_matches(good_r, [reference("waitk", {"k": 2}, s) for s in sentences])
    fatal(flood[0], flood[1], "rate_limited")
    assert codes(backlog[0]) == ["backlog_full"] and backlog[0][1]["rejected_words"] == 9 and backlog[1] == 1000
    warnings = [m for m in slow[0] if m["type"] == "warning"]
    assert [w["code"] for w in warnings] == ["slow_down"] and warnings[0]["backlog"] == 5
    assert [m["translation"] for m in slow[0] if m["type"] == "sentence"] != []    # nothing was dropped
    assert codes(too_long[0]) == ["sentence_too_long"] and too_long[1] == 1000
    assert codes(large[0]) == ["message_too_large"] and large[1] == 1000
    assert frame_code == 1009
    for r in (backlog, too_long, large):  # the rejected message changed nothing; the stream went on
        assert [m["translation"] for m in r[0] if m["type"] == "sentence"] == \
            [reference("waitk", {"k": 2}, "haus baum").prediction]


def test_auto_segment_cuts_a_sentence_with_no_end_instead_of_refusing_its_words(server, reference):
    """Unpunctuated text with auto_segment (speech recognition, chat): the server ends the open sentence before
    the word that would take it past max_words_per_sentence (6 here), over one message and across messages,
    with a `sentence_cut` warning; every word is translated, each piece as that sentence alone would be.
    Without auto_segment the same message is refused (the client cuts its own sentences)."""
    words = "haus baum licht wald mond sonne haus baum licht wald mond sonne haus baum".split()
    start = {**START, "auto_segment": True}
    cut = server.metric("simulserve_sentence_ends_total", cause="words")
    # (messages of at most 5 words, paced: the fixture's backlog takes 8)
    texts = [{"type": "text", "text": " ".join(words[i:i + n]) + " "} for i, n in ((0, 4), (4, 5), (9, 5))]
    received, code = asyncio.run(talk(server.url, [start, *texts, {"type": "end_stream"}], pace=lambda: 0.5,
                                      **server.auth))
    assert code == 1000 and not codes(received)
    cuts = [m for m in received if m["type"] == "warning" and m["code"] != "slow_down"]
    assert [w["code"] for w in cuts] == ["sentence_cut"] * 2 and "(1 time(s)" in cuts[0]["message"]
    assert server.metric("simulserve_sentence_ends_total", cause="words") - cut == 2
    pieces = [" ".join(words[:6]), " ".join(words[6:12]), " ".join(words[12:])]
    sentences = [m for m in received if m["type"] == "sentence"]
    assert [m["source"] for m in sentences] == pieces
    assert [m["translation"] for m in sentences] == [reference("waitk", {"k": 2}, p).prediction for p in pieces]
    refused, _ = asyncio.run(talk(server.url, [START, {"type": "words", "words": words[:7]}, {"type": "end_stream"}],
                                  **server.auth))
    assert codes(refused) == ["sentence_too_long"]


@pytest.mark.filterwarnings("ignore:Using `httpx`")
def test_not_ready_while_the_models_load(trained):
    from fastapi.testclient import TestClient

    from server.app import create_app
    from server.settings import load_settings
    client = TestClient(create_app(load_settings(models={"w": str(trained["waitk"])})))  # no lifespan: not loaded
    assert client.get("/health").status_code == 503 and client.get("/health").json()["status"] == "loading"
    with client.websocket_connect("/v1/stream") as ws:
        msg = ws.receive_json()
        assert msg["code"] == "not_ready" and msg["fatal"]


def test_a_stopping_server_closes_a_sending_stream_with_1012_not_a_reset(trained):
    """Shutdown while a client is still sending words: the close 1012 (service restart), then the closing
    handshake, so the client (or nginx between) reads the close frame. Closing the socket at once with words
    unread (uvicorn's own shutdown) sent a reset, and such a client saw 1006 in 8 of 8 tries: it reconnected
    all the same, but as after a dropped connection."""
    for _ in range(2):
        srv = LiveServer(models={"waitk": str(trained["waitk"])}, rate_limit=1e6, rate_burst=10**6,
                         max_words_per_sentence=10**6, max_backlog_words=10**6)
        with srv:
            async def main():
                ws = await connect(srv.url)
                await ws.send(json.dumps(START))
                assert json.loads(await ws.recv())["type"] == "ready"

                async def send_words():
                    try:
                        while True:
                            for _ in range(50):
                                await ws.send(json.dumps({"type": "words", "words": ["haus", "baum"]}))
                            await asyncio.sleep(0)
                    except ConnectionClosed:
                        pass
                sender = asyncio.create_task(send_words())
                await asyncio.sleep(0.3)            # words arriving faster than the stream takes them
                srv.server.should_exit = True       # uvicorn's graceful shutdown, as on SIGTERM
                try:
                    async with asyncio.timeout(20):
                        async for _ in ws:
                            pass
                except ConnectionClosed:
                    pass
                await sender
                return ws.close_code
            assert asyncio.run(main()) == 1012
