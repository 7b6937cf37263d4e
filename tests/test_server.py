"""The streaming server end to end: a real uvicorn server on a loopback port, real websocket clients.

Every stream's output must equal `simulate()` (the `translate` command's loop)
for the same sentences and settings, whatever the chunking, pacing, batching
with other streams, or bad input sent by other clients.
"""
from __future__ import annotations

import asyncio
import json
import random
import re
import socket
import threading
import time

import httpx
import pytest
import uvicorn
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from conftest import decoder_from, random_decoder
from models.data.synthetic import make_pairs
from models.translate import simulate
from server.app import create_app
from server.guard import uvicorn_config
from server.protocol import ERRORS, server_adapter
from server.settings import load_settings

SETTINGS = {"offline": [{}], "waitk": [{"k": 1}, {"k": 3}], "gma": [{"delta": 0.5}, {"delta": 2.0}]}
# longer than the tiny models' training sentences: they often write EOS before the source ends
LONG = [s for s, _ in make_pairs(4, min_len=12, max_len=20, seed=12)]


class LiveServer:
    """`create_app` served by uvicorn in a thread, on a free loopback port."""
    engines = 1   # engine processes (test_workers.py's WorkersServer: serve --engines)

    def __init__(self, **settings):
        # float32 unless a test asks for another form: the tests compare with float32 decoders
        # (the server's own default, int8 on the CPU, has tests of its own: test_int8.py)
        settings.setdefault("step", "default")
        # these tests open many streams at once on a cold server: admission by headroom, which would refuse
        # most of them (as it should), has tests of its own (test_admission.py)
        settings.setdefault("admission", False)
        self.settings = load_settings(**settings)
        self.app = create_app(self.settings)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", settings.get("port", 0)))   # (a port given: peers must know it beforehand)
        self.port = self.sock.getsockname()[1]
        self.http = f"http://127.0.0.1:{self.port}"
        self.url = f"ws://127.0.0.1:{self.port}/v1/stream"
        self.server = uvicorn.Server(uvicorn_config(self.app, self.settings, log_level="warning"))

    def __enter__(self):
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.http + "/health").status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError("server did not become healthy")

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)

    def metric(self, name: str, **labels) -> float:
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        text = httpx.get(self.http + "/metrics").text
        m = re.search(rf"^{name}(?:{{{re.escape(want)}}})? (\S+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    def wait_metric(self, name: str, value: float, timeout: float = 10, **labels) -> float:
        deadline = time.monotonic() + timeout
        while (v := self.metric(name, **labels)) != value and time.monotonic() < deadline:
            time.sleep(0.05)
        return v


async def talk(url: str, messages, *, pace=None, timeout: float = 60, **connect_kw):
    """Send `messages` (dict -> JSON, str -> raw text frame, bytes -> binary frame) while reading;
    returns (every server message, close code) once the server closes."""
    ws = await connect(url, **connect_kw)
    received = []

    async def reader():
        try:
            async for raw in ws:
                received.append(json.loads(raw))
        except ConnectionClosed:
            pass

    task = asyncio.create_task(reader())
    try:
        for m in messages:
            await ws.send(json.dumps(m) if isinstance(m, dict) else m)
            if pace:
                await asyncio.sleep(pace())
    except ConnectionClosed:
        pass
    try:
        await asyncio.wait_for(task, timeout)
    finally:
        try:
            await ws.close()
        except ConnectionClosed:
            pass
    return received, ws.close_code


def sentence_messages(sentences, chunking: str = "words", rng: random.Random | None = None) -> list[dict]:
    """Source messages for the sentences: word by word, random word groups, or random text cuts."""
    rng = rng or random.Random(0)
    out = []
    for sent in sentences:
        words = sent.split()
        if chunking == "words":
            out += [{"type": "words", "words": [w]} for w in words]
        elif chunking == "groups":
            i = 0
            while i < len(words):
                n = rng.randint(1, 4)
                out.append({"type": "words", "words": words[i:i + n]})
                i += n
        else:  # raw text cut anywhere, words split across chunks
            text, i = sent + " ", 0
            while i < len(text):
                n = rng.randint(1, 9)
                out.append({"type": "text", "text": text[i:i + n]})
                i += n
        out.append({"type": "end_sentence"})
    return out


def check_messages(received) -> None:
    """Every message matches the documented schema; word sequence numbers are 0, 1, 2... exactly."""
    for m in received:
        server_adapter.validate_python(m)
    assert [m["seq"] for m in received if m["type"] == "word"] == list(range(sum(
        m["type"] == "word" for m in received)))


def by_sentence(received) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for m in received:
        if m["type"] == "word":
            out.setdefault(m["sentence"], []).append(m)
    return out


def assert_matches(received, reference, label="") -> None:
    """Streamed words, delays and sentence results equal the simulate() reference, sentence by sentence."""
    check_messages(received)
    sentences = [m for m in received if m["type"] == "sentence"]
    assert [m["sentence"] for m in sentences] == list(range(len(reference))), label
    words = by_sentence(received)
    for i, (msg, ref) in enumerate(zip(sentences, reference)):
        got = words.get(i, [])
        assert [w["text"] for w in got] == ref.prediction.split(), (label, i)
        assert [w["delay"] for w in got] == ref.delays, (label, i)
        assert [w["index"] for w in got] == list(range(len(got)))
        assert msg["translation"] == ref.prediction and msg["delays"] == ref.delays, (label, i)
        assert msg["source_words"] == ref.source_words and msg["source"] == " ".join(ref.source.split()[
            :ref.source_words])
        # a model may write EOS before the source ends: the rest of the sentence is reported, not read
        assert msg["unread_words"] == len(ref.source.split()) - ref.source_words
    assert received[-1]["type"] == "end" and received[-1]["sentences"] == len(reference)


@pytest.fixture(scope="module")
def server(trained):
    with LiveServer(models={p: str(path) for p, path in trained.items()}, rate_limit=10000,
                    rate_burst=10000) as srv:
        yield srv


def make_reference(trained):
    """(policy, setting, sentence) -> the single-stream simulate() result."""
    decoders = {p: decoder_from(path) for p, path in trained.items()}
    cache = {}

    def ref(policy, setting, sentence):
        key = (policy, tuple(sorted(setting.items())), sentence)
        if key not in cache:
            cache[key] = simulate(decoders[policy], [sentence], batch_size=1, **setting)[0]
        return cache[key]
    return ref


@pytest.fixture(scope="module")
def reference(trained):
    return make_reference(trained)


def test_http_endpoints(server):
    h = httpx.get(server.http + "/health").json()
    assert h["status"] == "ok" and set(h["models"]) == {"offline", "waitk", "gma"}
    models = {m["name"]: m for m in httpx.get(server.http + "/v1/models").json()["models"]}
    assert models["waitk"]["policy"] == "waitk" and models["waitk"]["settings"]["k"]["min"] == 1
    assert models["gma"]["settings"]["delta"]["default"] == 1.0 and models["offline"]["settings"] == {}
    proto = httpx.get(server.http + "/v1/protocol").json()
    assert set(proto["errors"]) == set(ERRORS) and "Start" in proto["client"] and "Word" in proto["server"]
    assert "simulserve_active_streams" in httpx.get(server.http + "/metrics").text
    assert httpx.get(server.http + "/openapi.json").json()["info"]["title"] == "simulserve"
    assert httpx.get(server.http + "/").status_code == 200


@pytest.mark.parametrize("policy", ["offline", "waitk", "gma"])
def test_stream_equals_translate(policy, server, reference):
    """For every policy and setting: streamed words and delays equal `simulserve translate`."""
    check_stream_equals_translate(server.url, policy, reference)


def check_stream_equals_translate(url, policy, reference):
    sentences = [s for s, _ in make_pairs(6, min_len=1, max_len=9, seed=11)] + LONG

    async def main():
        runs = []
        for setting in SETTINGS[policy]:
            msgs = [{"type": "start", "model": policy, **setting}] + sentence_messages(sentences) \
                + [{"type": "end_stream"}]
            runs.append(talk(url, msgs))
        return await asyncio.gather(*runs)

    for setting, (received, code) in zip(SETTINGS[policy], asyncio.run(main())):
        assert code == 1000
        assert received[0]["type"] == "ready" and received[0]["policy"] == policy
        assert_matches(received, [reference(policy, setting, s) for s in sentences], setting)
        assert all(m["latency"] is None or set(m["latency"]) == {"AL", "LAAL", "AP", "DAL", "CW"}
                   for m in received if m["type"] == "sentence")


def test_fifty_concurrent_streams(server, reference):
    """Random models, settings, chunking and pacing: each stream equals its single-stream run."""
    rng = random.Random(5)
    pool = [s for s, _ in make_pairs(30, min_len=1, max_len=9, seed=21)] + \
        [s for s, _ in make_pairs(10, min_len=10, max_len=20, seed=22)]
    plans = []
    for i in range(50):
        policy = rng.choice(list(SETTINGS))
        setting = rng.choice(SETTINGS[policy])
        sentences = rng.sample(pool, rng.randint(2, 3))
        auto = i % 5 == 0
        if auto:   # continuous text, cut by the server at sentence-final punctuation
            sentences = [s + "." for s in sentences]
            text, msgs, j = " ".join(sentences) + " ", [], 0
            while j < len(text):
                n = rng.randint(1, 12)
                msgs.append({"type": "text", "text": text[j:j + n]})
                j += n
        else:
            msgs = sentence_messages(sentences, rng.choice(["words", "groups", "text"]), rng)
        msgs = [{"type": "start", "model": policy, "auto_segment": auto, **setting}] + msgs \
            + [{"type": "end_stream"}]
        delay = rng.choice([0.0, 0.002, 0.01])
        plans.append((policy, setting, sentences, msgs, random.Random(i), delay))
    base = server.metric("simulserve_active_streams")

    async def main():
        return await asyncio.gather(*(talk(server.url, msgs, pace=lambda r=r, d=d: r.uniform(0, d))
                                      for _, _, _, msgs, r, d in plans))

    results = asyncio.run(main())
    for (policy, setting, sentences, *_), (received, code) in zip(plans, results):
        assert code == 1000
        assert_matches(received, [reference(policy, setting, s) for s in sentences], (policy, setting))
    assert server.wait_metric("simulserve_active_streams", base) == base
    for p in SETTINGS:
        assert server.wait_metric("simulserve_cache_slots_in_use", 0, model=p) == 0
    # the streams were batched together (a behaviour, not a timing: 50 streams were ready at once)
    assert server.metric("simulserve_batch_size_bucket", le="1.0", model="waitk") \
        < server.metric("simulserve_batch_size_count", model="waitk")


def codes(received) -> list[str]:
    return [m["code"] for m in received if m["type"] == "error"]


def test_bad_input_gets_codes_and_other_streams_carry_on(server, reference):
    sentences = [s for s, _ in make_pairs(5, min_len=2, max_len=9, seed=31)]
    good_msgs = [{"type": "start", "model": "gma", "delta": 0.5}] + sentence_messages(sentences) \
        + [{"type": "end_stream"}]
    start = {"type": "start", "model": "waitk", "k": 2}
    ok_tail = [{"type": "words", "words": ["haus", "baum"]}, {"type": "end_stream"}]
    cases = {  # name: (messages, expected error codes in order)
        "malformed_json": (['{"type": "start"', start] + ok_tail, ["bad_json"]),
        "not_an_object": (["[1, 2]", start] + ok_tail, ["bad_message"]),
        "unknown_type": ([{"type": "hello"}, start] + ok_tail, ["unknown_type"]),
        "wrong_types": ([{"type": "start", "model": "waitk", "k": "3"}, start,
                         {"type": "words", "words": "haus"}, {"type": "text", "text": 5},
                         {"type": "words", "words": ["haus"], "extra": 1}] + ok_tail, ["bad_message"] * 4),
        "unknown_model": ([{"type": "start", "model": "nope"}, start] + ok_tail, ["unknown_model"]),
        "bad_settings": ([{"type": "start", "model": "waitk", "k": 0}, {"type": "start", "model": "waitk", "k": 99},
                          {"type": "start", "model": "waitk", "delta": 1.0},
                          {"type": "start", "model": "gma", "delta": -1}, {"type": "start", "model": "offline", "k": 2},
                          start] + ok_tail, ["bad_setting"] * 5),
        "oversized": ([start, json.dumps({"type": "text", "text": "x " * 9000})] + ok_tail, ["message_too_large"]),
        "binary": ([start, b"\x00\x01binary"] + ok_tail, ["binary_frame"]),
        "before_start": ([{"type": "words", "words": ["haus"]}, start] + ok_tail, ["not_started"]),
        "second_start": ([start, start] + ok_tail, ["already_started"]),
        "too_long": ([start, {"type": "words", "words": ["haus"] * 60}] + ok_tail, ["sentence_too_long"]),
        "after_end": ([start] + ok_tail + [{"type": "words", "words": ["haus"]}], ["stream_ended"]),
        "bad_unicode": ([start, '{"type": "text", "text": "\\ud800 "}'] + ok_tail, ["bad_message"]),
        "huge_number": (['{"type": "start", "k": ' + "9" * 5000 + "}", start] + ok_tail, ["bad_json"]),
        "deep_json": (["[" * 5000 + "]" * 5000, start] + ok_tail, ["bad_json"]),
    }

    async def main():
        good = [talk(server.url, good_msgs, pace=lambda: 0.003) for _ in range(2)]
        bad = [talk(server.url, msgs) for msgs, _ in cases.values()]
        return await asyncio.gather(*good, *bad)

    results = asyncio.run(main())
    for received, code in results[:2]:
        assert code == 1000 and not codes(received)
        assert_matches(received, [reference("gma", {"delta": 0.5}, s) for s in sentences])
    ref = reference("waitk", {"k": 2}, "haus baum")
    for (name, (_, expected)), (received, code) in zip(cases.items(), results[2:]):
        errors = [m for m in received if m["type"] == "error"]
        assert codes(received) == expected, name
        assert all(not e["fatal"] for e in errors), name
        if name == "too_long":
            assert errors[0]["rejected_words"] == 60
        # the connection survived every non-fatal error and translated correctly afterwards
        assert code == 1000, name
        assert [w["text"] for w in received if w["type"] == "word"] == ref.prediction.split(), name


def test_disconnect_mid_sentence_frees_the_stream(server):
    base = server.metric("simulserve_active_streams")

    async def main():
        socks = []
        for model in ("waitk", "gma", "offline"):
            ws = await connect(server.url)
            await ws.send(json.dumps({"type": "start", "model": model}))
            await ws.send(json.dumps({"type": "words", "words": ["haus", "baum", "stein", "wald"]}))
            assert json.loads(await ws.recv())["type"] == "ready"
            socks.append(ws)
        assert server.metric("simulserve_active_streams") == base + 3
        for m in ("waitk", "gma", "offline"):   # each holds a sentence in progress
            assert server.wait_metric("simulserve_cache_slots_in_use", 1, model=m) == 1
        await socks[0].close()          # a clean close
        socks[1].transport.abort()      # a dropped connection
        socks[2].transport.abort()

    asyncio.run(main())
    assert server.wait_metric("simulserve_active_streams", base) == base
    for m in ("waitk", "gma", "offline"):
        assert server.wait_metric("simulserve_cache_slots_in_use", 0, model=m) == 0
    assert httpx.get(server.http + "/health").status_code == 200


@pytest.mark.parametrize("compression", [False, True])
def test_permessage_deflate_is_off_unless_asked_for(trained, compression):
    """A client offering compression (websockets does by default) gets none unless ws_compression is set:
    a stream's messages are tiny, and deflating each one cost the event loop more than it saved."""
    async def negotiated(url):
        ws = await connect(url)
        try:
            await ws.send(json.dumps({"type": "start", "model": "gma"}))
            assert json.loads(await ws.recv())["type"] == "ready"
            return (ws.response.headers.get("Sec-WebSocket-Extensions"),
                    ws.request.headers.get("Sec-WebSocket-Extensions"))
        finally:
            await ws.close()
    with LiveServer(models={"gma": str(trained["gma"])}, ws_compression=compression) as srv:
        answered, offered = asyncio.run(negotiated(srv.url))
    assert "permessage-deflate" in offered
    assert (answered is not None and "permessage-deflate" in answered) == compression


def test_each_source_word_is_encoded_once(trained, monkeypatch):
    """The handler encodes a word to check the sentence's length and hands the subwords to the engine, whose
    step does not encode it again (that work would fall on the stepping thread, the server's bottleneck)."""
    from models.tokenizer import Tokenizer
    sentences = ["a b c d", "e f g"]
    with LiveServer(models={"gma": str(trained["gma"])}) as srv:
        calls = []
        encode_word = Tokenizer.encode_word
        monkeypatch.setattr(Tokenizer, "encode_word", lambda self, w: calls.append(w) or encode_word(self, w))
        msgs = [{"type": "start", "model": "gma"}] + sentence_messages(sentences, "groups") + [{"type": "end_stream"}]
        received, code = asyncio.run(talk(srv.url, msgs))
    assert code == 1000 and [m["type"] for m in received].count("sentence") == 2
    assert sorted(calls) == sorted(" ".join(sentences).split())


def test_push_takes_the_callers_subwords_and_encodes_only_without_them(word_tok):
    dec = random_decoder(word_tok, "waitk")
    s = dec.new_stream()
    dec.push(s, ["a", "b"], encoded=[[7], [8, 9]])
    assert [pieces for _, pieces in s.inbox] == [[7], [8, 9]]
    t = dec.new_stream()
    dec.push(t, ["a b"], encoded=[[7]])   # a word with whitespace: split, and encoded here
    assert [pieces for _, pieces in t.inbox] == [word_tok.encode_word("a"), word_tok.encode_word("b")]
