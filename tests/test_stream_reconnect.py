"""`simulserve stream` when the server goes away mid-stream: it reconnects and loses nothing.

A real server (uvicorn, tiny trained models) is stopped while a paced stream runs; its websockets get
close code 1012 (service restart). A new server comes up on the same port (as a restarted container, or
nginx's other replica, would answer) and the client, on its own, reconnects, sends the unfinished
sentences again and finishes: every sentence translated once, as `simulate` translates it alone.
tests/test_container.py runs the same through nginx with two container replicas.
"""
from __future__ import annotations

import asyncio
import io
import json
import socket
import threading
import time

import pytest

from clients.stream import Captions, ClientError, _consume, stream_lines
from clients.subtitles import LiveSubtitles
from models.data.synthetic import make_pairs
from test_server import LiveServer, make_reference
from test_subtitles import parse


class PortServer(LiveServer):
    """LiveServer on a chosen port, so that a second one can take over the first one's address."""

    def __init__(self, port: int, **settings):
        super().__init__(**settings)
        self.sock.close()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.port = port
        self.http = f"http://127.0.0.1:{port}"
        self.url = f"ws://127.0.0.1:{port}/v1/stream"


@pytest.mark.slow
def test_stream_reconnects_after_the_server_restarts(trained, tmp_path):
    reference = make_reference(trained)
    models = {p: str(path) for p, path in trained.items()}
    lines = [s for s, _ in make_pairs(6, min_len=4, max_len=8, seed=77)]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    first = PortServer(port, models=models).__enter__()
    second = None
    notes: list[str] = []
    shown = io.StringIO()
    vtt = LiveSubtitles(open(tmp_path / "talk.vtt", "w", encoding="utf-8"))

    def restart():
        nonlocal second
        time.sleep(1.0)                      # mid-stream: a few sentences in
        first.__exit__(None, None, None)
        second = PortServer(port, models=models).__enter__()

    t = threading.Thread(target=restart)
    t.start()
    try:
        # reconnect=6: the second server may take seconds to load its models on a loaded CI machine, and
        # the default 3 tries (0.5 + 1 + 2 s of back-off) are about a user's patience, not this test's
        summary = asyncio.run(stream_lines(first.url, lines, model="waitk", k=2, wpm=600, reconnect=6, share=True,
                                           warn=notes.append,
                                           captions=Captions(out=shown, live=False, words=True, listeners=[vtt])))
    finally:
        vtt.close()
        t.join(60)
        for srv in (first, second):
            if srv is not None:
                srv.__exit__(None, None, None)
    reconnects = [n for n in notes if "reconnecting" in n]
    assert len(reconnects) == 1 and "code 1012" in reconnects[0], notes
    # shared captions: the restarted server has no feed for the key, so the client opened a new one and said so
    links = [n for n in notes if "viewers watch the captions at" in n]
    assert len(links) == 2 and links[0] != links[1] and any("need the new link" in n for n in notes), notes
    assert summary.share["url"] in links[1] and summary.connections[-1]["share"] == summary.share
    assert 0 < len(summary.sentences) and [s["sentence"] for s in summary.sentences] == list(range(len(lines)))
    assert [s["translation"] for s in summary.sentences] == \
        [reference("waitk", {"k": 2}, line).prediction for line in lines]
    for i, sentence in enumerate(summary.sentences):    # no word of a restarted sentence shown twice
        assert " ".join(w["text"] for w in summary.words if w["sentence"] == i) == sentence["translation"]
    # `--words`: a program reading the lines, dropping what a "restart" voids, has every sentence's words once
    kept, restarts = [], 0
    for msg in map(json.loads, shown.getvalue().splitlines()):
        if msg["type"] == "restart":
            restarts += 1
            kept = [m for m in kept if m["sentence"] < msg["sentence"]]
        elif msg["type"] == "word":
            kept.append(msg)
    assert restarts == 1
    assert [" ".join(m["text"] for m in kept if m["sentence"] == i) for i in range(len(lines))] == \
        [s["translation"] for s in summary.sentences]
    # the subtitles: a sentence sent again starts a new line, so every line is a run of one translation's words
    # (without restart() a line would hold the voided words and then the same words again)
    translations = [f" {s['translation']} " for s in summary.sentences]
    cues = parse((tmp_path / "talk.vtt").read_text(encoding="utf-8"))
    assert cues and all(any(f" {line} " in t for t in translations) for _, _, text in cues for line in text.split("\n"))


@pytest.mark.slow
def test_stream_gives_up_when_nobody_answers_again(trained):
    models = {p: str(path) for p, path in trained.items()}
    lines = [s for s, _ in make_pairs(4, min_len=4, max_len=8, seed=78)]
    srv = LiveServer(models=models).__enter__()
    notes: list[str] = []
    threading.Timer(0.8, srv.__exit__, (None, None, None)).start()
    with pytest.raises(ClientError) as e:
        asyncio.run(stream_lines(srv.url, lines, model="waitk", k=2, wpm=300, reconnect=1, warn=notes.append))
    assert e.value.exit_code == 2 and "cannot reach" in str(e.value)
    assert any("reconnecting (1/1)" in n for n in notes), notes


def test_auto_segment_pending_words_drop_what_a_sentence_consumed():
    pending = [["a", "b."], ["c", "d"], [], ["e."]]
    _consume(pending, {"source_words": 2, "unread_words": 0}, auto_segment=True)
    assert pending == [["c", "d"], [], ["e."]]
    _consume(pending, {"source_words": 1, "unread_words": 1}, auto_segment=True)   # ended by the blank line
    assert pending == [["e."]]
    lines = [["x"], ["y"]]
    _consume(lines, {"source_words": 5, "unread_words": 0}, auto_segment=False)
    assert lines == [["y"]]
