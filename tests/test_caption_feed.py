"""`simulserve stream --serve-captions`: the client serves the live captions to an audience's browsers
(clients/caption_feed.py): a Server-Sent Events feed of the roll-up lines and a full-screen page."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import httpx
import pytest

import clients.caption_feed as caption_feed
from clients.caption_feed import CaptionFeed, CaptionServer, parse_address
from clients.subtitles import cues
from models.data.synthetic import make_pairs
from test_browser import browser   # noqa: F401 - the fixture
from test_client import KEY, ROOT, server   # noqa: F401 - the fixtures


def word(sentence, text):
    return {"type": "word", "sentence": sentence, "text": text}


def read_events(url: str, out: list, ready: threading.Event) -> None:
    with httpx.stream("GET", url + "events", timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
        ready.set()
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
                if out[-1]["ended"]:
                    return


def test_viewers_get_the_roll_up_lines_as_words_arrive_and_late_ones_the_current_text(monkeypatch):
    feed = CaptionFeed()
    srv = CaptionServer(feed).start()
    try:
        first, ready = [], threading.Event()
        t = threading.Thread(target=read_events, args=(srv.url, first, ready))
        t.start()
        assert ready.wait(10)
        words = [word(0, w) for w in "Good morning everyone .".split()] + [word(1, "Today")]
        for w in words[:3]:
            feed.word(w)
        late, late_ready = [], threading.Event()
        t2 = threading.Thread(target=read_events, args=(srv.url, late, late_ready))
        t2.start()
        assert late_ready.wait(10)
        for w in words[3:]:
            feed.word(w)
        feed.restart(1)                                  # a reconnect sends sentence 1 again
        feed.word(word(1, "Today"))
        feed.end()
        t.join(10), t2.join(10)
        roll = [text.split("\n") for _, _, text in cues([{**w, "received_s": i} for i, w in enumerate(words)])]
        assert [e["lines"] for e in first] == [[]] + roll + [["Good morning everyone .", "Today"]] * 2
        assert [e["ended"] for e in first] == [False] * (len(first) - 1) + [True]
        assert late[0]["lines"] == ["Good morning everyone"] and late[1:] == first[-len(late) + 1:]
        deadline = time.monotonic() + 5   # (a viewer's thread forgets it just after writing the end, which the
        while feed.viewers and time.monotonic() < deadline:   # client may have read before that)
            time.sleep(0.01)
        assert feed.served == 2 and not feed.viewers
        page = httpx.get(srv.url)
        assert page.status_code == 200 and 'EventSource("events")' in page.text
        assert httpx.get(srv.url + "nothing").status_code == 404
        monkeypatch.setattr(caption_feed, "MAX_VIEWERS", 0)
        assert httpx.get(srv.url + "events").status_code == 503
    finally:
        srv.close()


def test_addresses():
    assert parse_address("8080") == ("127.0.0.1", 8080)
    assert parse_address("0.0.0.0:0") == ("0.0.0.0", 0)
    assert parse_address("[::1]:9000") == ("::1", 9000)
    for bad in ("http://x", "70000", "host:"):
        with pytest.raises(ValueError, match="--serve-captions"):
            parse_address(bad)


@pytest.mark.browser
def test_a_stream_shows_its_captions_in_a_viewers_browser(browser, server, tmp_path):  # noqa: F811
    """A real server, the real client with --serve-captions on a free port, and Chromium on the viewer page: the
    page shows the roll-up of the words the client received, and says when the stream has ended."""
    talk = tmp_path / "talk.txt"
    talk.write_text("\n".join(s for s, _ in make_pairs(6, min_len=3, max_len=6, seed=81)) + "\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SIMULSERVE_API_KEY": KEY}
    proc = subprocess.Popen([sys.executable, "-m", "clients.cli", "stream", str(talk), "--url", server.url,
                             "--model", "waitk", "--k", "2", "--wpm", "300", "--words", "--serve-captions", "0"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    page = browser.new_page()
    try:
        line = proc.stderr.readline()
        assert "captions for viewers at http://127.0.0.1:" in line, line
        page.goto(line.split(" at ")[1].strip())
        page.wait_for_function("document.querySelector('#captions').textContent.length > 0", timeout=30_000)
        assert page.inner_text("#status") == "live"
        page.wait_for_function("document.querySelector('#status').dataset.state === 'ended'", timeout=60_000)
        shown = [t.strip() for t in page.locator("#captions .line").all_inner_texts()]
        out, err = proc.communicate(timeout=30)
    finally:
        page.close()
        proc.kill()
    assert proc.returncode == 0, err
    words = [m for m in map(json.loads, out.splitlines()) if m["type"] == "word"]
    assert shown == cues(words)[-1][2].split("\n")    # the last two lines, as the subtitles' last cue


@pytest.mark.browser
def test_the_viewer_page_sets_text_size_and_theme_and_keeps_them(browser):  # noqa: F811
    """A link's ?size= and ?theme= set the page; A+ (or the + key) steps the size up, the theme button toggles;
    the browser keeps the viewer's last choice for the next visit."""
    feed = CaptionFeed()
    srv = CaptionServer(feed).start()
    context = browser.new_context(viewport={"width": 1000, "height": 700})
    page = context.new_page()
    size = "parseFloat(getComputedStyle(document.querySelector('#captions')).fontSize)"
    background = "getComputedStyle(document.body).backgroundColor"
    try:
        for w in "Good morning everyone".split():
            feed.word(word(0, w))
        page.goto(srv.url)
        page.wait_for_function("document.querySelector('#captions').textContent.includes('morning')")
        base = page.evaluate(size)                       # 3.8vw of 1000 px
        assert base == pytest.approx(38, abs=0.5) and page.evaluate(background) == "rgb(11, 13, 16)"
        page.goto(srv.url + "?size=2&theme=light")        # an operator's link for a projector
        page.wait_for_function("document.querySelector('#captions').textContent.includes('morning')")
        assert page.evaluate(size) == pytest.approx(2 * base, abs=0.5)
        assert page.evaluate(background) == "rgb(255, 255, 255)"
        page.mouse.move(30, 20)                          # the controls show
        page.click("#larger")
        assert page.evaluate(size) == pytest.approx(2.44 * base, abs=0.5)
        page.keyboard.press("-")
        page.keyboard.press("-")
        assert page.evaluate(size) == pytest.approx(1.56 * base, abs=0.5)
        page.keyboard.press("t")
        assert page.evaluate(background) == "rgb(11, 13, 16)"
        page.goto(srv.url)                               # the next visit keeps the viewer's choice
        page.wait_for_function("document.querySelector('#captions').textContent.includes('morning')")
        assert page.evaluate(size) == pytest.approx(1.56 * base, abs=0.5)
        assert page.evaluate(background) == "rgb(11, 13, 16)"
    finally:
        context.close()
        feed.end()
        srv.close(feed)
