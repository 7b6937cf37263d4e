"""The stream log (server/stream_log.py): one line per websocket on a real server, with the counts its client saw
and what ended it, and never a word of what was said."""
from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest
from websockets.asyncio.client import connect

from test_server import LiveServer, talk

KEY = "log-test-key"
WORDS = ["haus", "baum", "licht.", "wald", "stein"]   # two sentences: "licht." ends one, end_stream the other


def lines(caplog, n: int, timeout: float = 10.0) -> list[str]:
    """The stream log's lines, once there are `n` (a session logs after its socket has closed)."""
    deadline = time.monotonic() + timeout
    while True:
        got = [r.getMessage() for r in caplog.records if r.name == "simulserve.streams"]
        if len(got) >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


@pytest.fixture
def server(trained, caplog):
    caplog.set_level(logging.INFO, logger="simulserve.streams")
    with LiveServer(models={"waitk": str(trained["waitk"])}, api_keys=[KEY], start_timeout_s=0.5) as srv:
        yield srv


def test_one_line_per_stream_with_what_its_client_saw(server, caplog):
    auth = {"additional_headers": {"Authorization": f"Bearer {KEY}"}}
    received, code = asyncio.run(talk(server.url, [
        {"type": "start", "model": "waitk", "k": 2, "auto_segment": True},
        {"type": "words", "words": WORDS}, {"type": "end_stream"}], **auth))
    assert code == 1000
    ready = received[0]
    words = [m for m in received if m["type"] == "word"]
    sentences = [m for m in received if m["type"] == "sentence"]
    assert len(sentences) == 2
    [line] = lines(caplog, 1)
    assert line.startswith(f"stream {ready['stream']} from 127.0.0.1: waitk (k=2, auto_segment), ")
    lags = [w["lag_ms"] for w in words]
    assert line.endswith(f"s, 2 sentence(s), {len(WORDS)} word(s) in, {len(words)} out (lag mean "
                         f"{sum(lags) / len(lags):.0f} ms, max {max(lags):.0f} ms); ended by the client (end_stream)")

    async def leave_mid_sentence():   # the client goes away without end_stream
        async with connect(server.url, **auth) as ws:
            await ws.send(json.dumps({"type": "start", "model": "waitk", "k": 3}))
            await ws.recv()
            await ws.send(json.dumps({"type": "words", "words": ["haus", "baum"]}))
    asyncio.run(leave_mid_sentence())
    line = lines(caplog, 2)[1]
    assert "waitk (k=3), " in line and "2 word(s) in" in line
    assert line.endswith("the client closed the connection (close code 1000)")

    # a wrong key, a client that never starts, one whose start is refused: refused, closed by the server, and
    # closed by the client after its error
    asyncio.run(talk(server.url, [], additional_headers={"Authorization": "Bearer wrong"}))
    asyncio.run(talk(server.url, [], **auth))

    async def bad_setting():
        async with connect(server.url, **auth) as ws:
            await ws.send(json.dumps({"type": "start", "model": "waitk", "k": 9999}))
            assert json.loads(await ws.recv())["code"] == "bad_setting"
    asyncio.run(bad_setting())
    refused, silent, bad = lines(caplog, 5)[2:]
    assert refused == "connection from 127.0.0.1 refused: unauthorized"
    assert silent.startswith("connection without a stream from 127.0.0.1: no model, ")
    assert silent.endswith("0 sentence(s), 0 word(s) in, 0 out; closed by the server: start_timeout")
    assert bad.endswith("the client closed the connection (close code 1000) after error bad_setting")
    # what was said stays out of the log
    said = {w.strip(".") for w in WORDS} | {w["text"].strip(".") for w in received if w["type"] == "word"}
    assert not any(w in line for line in lines(caplog, 5) for w in said)


def test_a_stopping_server_says_so(trained, caplog):
    caplog.set_level(logging.INFO, logger="simulserve.streams")
    srv = LiveServer(models={"waitk": str(trained["waitk"])}).__enter__()

    async def hold():
        async with connect(srv.url) as ws:
            await ws.send(json.dumps({"type": "start"}))
            await ws.recv()
            await asyncio.to_thread(srv.__exit__, None, None, None)   # SIGTERM's graceful shutdown
            try:
                await asyncio.wait_for(ws.recv(), 10)
            except Exception:  # noqa: BLE001 - the close is what it waits for
                pass
            return ws.close_code
    assert asyncio.run(hold()) == 1012
    [line] = lines(caplog, 1)
    assert line.endswith("server stopping (close code 1012, restarting)")
