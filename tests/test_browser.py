"""The caption page in a real browser: Debian's Chromium, driven by Playwright, against a real server process.

The server (`simulserve serve`, a subprocess on a free loopback port, with an API key) serves the tiny
models of the `trained` fixture, which learned to copy made-up words: typing "haus baum licht" must
caption "haus baum licht" in both panes (GMA and wait-k). Screenshots go to artifacts/.

Needs Chromium from Debian (`bash docker/install-browser.sh`, run by `make setup-test`) and the
`playwright` Python package (the `test` extra); without them the tests are skipped, with the reason.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = os.environ.get("SIMULSERVE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update", "--disable-gpu",
                 "--no-first-run", "--disable-sync", "--disable-quic"]
KEY = "caption-test-key"
TIMEOUT_MS = 20_000

pytestmark = pytest.mark.browser


class ServerProcess:
    """`simulserve serve` in a subprocess; stop() and start() again on the same port."""

    def __init__(self, models: dict[str, Path], log: Path, extra: tuple[str, ...] = ()):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "clients.cli", "serve", *(f"{n}={p}" for n, p in models.items()),
                    "--host", "127.0.0.1", "--port", str(self.port), "--api-key", KEY, "--torch-threads", "1",
                    "--no-warmup", "--log-level", "warning", *extra]
        self.log = log
        self.proc = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}):\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the server did not become healthy:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[test]')")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM}: run `bash docker/install-browser.sh` (Debian's chromium)")
    with sync_playwright() as pw:
        try:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        except Error as e:
            pytest.skip(f"Chromium at {CHROMIUM} does not start: {str(e).splitlines()[0]}")
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def server(trained, tmp_path_factory):
    srv = ServerProcess({"gma": trained["gma"], "waitk": trained["waitk"]},
                        tmp_path_factory.mktemp("browser_server") / "server.log")
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def page(browser, server):
    """A fresh page; JavaScript errors fail the test; every websocket frame the server sent is kept."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.js_errors = []
    page.frames_in = []   # [(websocket number, message)]
    page.on("pageerror", lambda e: page.js_errors.append(str(e)))

    def on_ws(ws, n=[0]):
        n[0] += 1
        k = n[0]
        ws.on("framereceived", lambda payload: page.frames_in.append((k, json.loads(payload))))
    page.on("websocket", on_ws)
    yield page
    context.close()
    assert not page.js_errors, f"JavaScript errors on the page: {page.js_errors}"


def open_page(page, server) -> None:
    """Load the page and give it the API key; both panes (GMA, wait-k) become ready."""
    page.goto(server.url + "/")
    page.fill("#api-key", KEY)
    page.dispatch_event("#api-key", "change")
    for pane in ("a", "b"):
        page.wait_for_selector(f"#pane-{pane} .status[data-state=ready]")


def say(page, text: str) -> None:
    """Type one sentence into the live box, as a person would, and end it with Enter."""
    page.click("#live-input")
    page.keyboard.type(text, delay=15)
    page.keyboard.press("Enter")


def sentence(page, pane: str, i: int) -> str:
    return f"#pane-{pane} li.sentence[data-sentence='{i}']"


def sent_by(page, model: str) -> dict[str, list[dict]]:
    """The messages of the latest websocket whose stream opened `model`, by type."""
    streams: dict[int, dict[str, list[dict]]] = {}
    for n, msg in page.frames_in:
        streams.setdefault(n, {}).setdefault(msg["type"], []).append(msg)
    mine = [n for n, msgs in streams.items() if msgs.get("ready") and msgs["ready"][0]["model"] == model]
    assert mine, f"no stream of {model} was opened"
    return streams[mine[-1]]


def wait_done(page, pane: str, i: int):
    page.wait_for_selector(sentence(page, pane, i) + "[data-done=true]")
    return page.locator(sentence(page, pane, i))


def test_bad_key_then_captions_side_by_side(page, server):
    page.goto(server.url + "/")
    # no key: both streams are refused, and the page says why
    for pane in ("a", "b"):
        page.wait_for_selector(f"#pane-{pane}[data-error=unauthorized]")
        assert "API key" in page.inner_text(f"#pane-{pane} .alert")
    # the right key, then both policies stream side by side
    page.fill("#api-key", KEY)
    page.dispatch_event("#api-key", "change")
    for pane in ("a", "b"):
        page.wait_for_selector(f"#pane-{pane} .status[data-state=ready]")
    assert "GMA" in page.inner_text("#pane-a .status")
    assert "wait-k k=" in page.inner_text("#pane-b .status")
    k = int(page.input_value("#pane-b .knob-value"))

    say(page, "haus baum licht")
    say(page, "wald stein wasser feuer")
    for pane, model in (("a", "gma"), ("b", "waitk")):
        s0, s1 = wait_done(page, pane, 0), wait_done(page, pane, 1)
        # the models learned to copy: the first sentence's captions are known; the page shows the server's words
        assert s0.locator(".translation").inner_text() == "haus baum licht"
        server_said = sent_by(page, model)
        assert s1.locator(".translation").inner_text() == server_said["sentence"][1]["translation"]
        assert server_said["sentence"][1]["translation"] in page.inner_text(f"#pane-{pane} .caption")
        assert [t.strip() for t in s0.locator(".src").all_inner_texts()] == ["haus", "baum", "licht", "⏎"]
        for s, i in ((s0, 0), (s1, 1)):
            latency = server_said["sentence"][i]["latency"]
            assert s.locator("[data-metric=AL]").inner_text() == f"AL {latency['AL']:.2f}"
            assert s.locator("[data-metric=CW]").inner_text() == f"CW {latency['CW']:.2f}"
            # READ/WRITE rhythm: each target word sits under the source word after which the server wrote it
            words = [w for w in server_said["word"] if w["sentence"] == i]
            chips = s.locator(".tgt").all()
            assert [c.inner_text() for c in chips] == [w["text"] for w in words]
            for chip, w in zip(chips, words):
                col = chip.evaluate("e => e.parentElement.dataset.col")
                assert col == ("end" if w["source_complete"] else str(max(w["delay"], 1) - 1)), (pane, w)
        assert "mean AL" in page.inner_text(f"#pane-{pane} .summary")
    # wait-k reads k words before its first write
    assert sent_by(page, "waitk")["word"][0]["delay"] >= k

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "caption_page.png"), full_page=True)


def test_a_lost_connection_is_shown_and_nothing_typed_is_lost(page, server):
    """The server goes away mid-sentence: the panes say so, hold what is typed meanwhile, reconnect by themselves
    when it is back, and send the unfinished sentence again from its first word: its translation is whole."""
    open_page(page, server)
    say(page, "berg fluss stadt")
    wait_done(page, "a", 0)
    wait_done(page, "b", 0)
    page.click("#live-input")
    page.keyboard.type("haus baum ", delay=15)          # two words of the next sentence go out
    page.wait_for_function("window.simulserve.state.panes.every((p) => p.sentences.length === 2)")
    server.stop()
    try:
        for pane in ("a", "b"):
            page.wait_for_selector(f"#pane-{pane} .status[data-state=disconnected]")
            assert "Disconnected from the server" in page.inner_text(f"#pane-{pane} .alert")
        page.keyboard.type("licht", delay=15)           # the sentence's end, typed while the server is down
        page.keyboard.press("Enter")
        page.wait_for_function("document.querySelector('#pane-a .alert').textContent.includes('3 word(s) held')")
        assert "connection lost" in page.inner_text(sentence(page, "a", 1))
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "caption_page_disconnected.png"), full_page=True)
    finally:
        server.start()
    for pane, model in (("a", "gma"), ("b", "waitk")):   # back by themselves (retries after 1, 2, 4... s)
        page.wait_for_selector(f"#pane-{pane} .status[data-state=ready]", timeout=60_000)
        assert wait_done(page, pane, 1).locator(".translation").inner_text() == "haus baum licht"
        assert sent_by(page, model)["sentence"][0]["source"] == "haus baum licht"   # sent again, whole
        assert page.locator(f"#pane-{pane} .alert").is_hidden()
        assert page.locator(f"#pane-{pane} li.sentence").count() == 2
    assert page.locator("li.sentence.interrupted").count() == 0
    say(page, "meer wind")
    for pane in ("a", "b"):
        assert wait_done(page, pane, 2).locator(".translation").inner_text() == "meer wind"
    # the subtitles: the sentence sent again starts a new line, and its whole translation is the last cue's
    from clients.subtitles import cues
    arrivals = page.evaluate("window.simulserve.state.panes[0].arrivals")
    assert any("restart" in a for a in arrivals)
    texts = [text for _, _, text in cues(as_words(arrivals))]
    assert "haus baum licht" in [t.split("\n")[-1] for t in texts]
    assert not any("haus baum haus" in t for t in texts)


def test_saved_subtitles_and_transcript_are_what_the_page_showed(page, server):
    """The page's "save" buttons: the subtitles are the CLI's WebVTT (clients/subtitles.py) of the words as they
    arrived, the transcript the sentences' translations; the page's cue maker equals the Python one on edge cases."""
    from clients.subtitles import webvtt
    open_page(page, server)
    assert page.is_disabled("#pane-a .save-vtt") and page.is_disabled("#pane-a .save-txt")   # nothing shown yet
    say(page, "haus baum licht")
    say(page, "wald stein wasser feuer")
    for pane, model, n in (("a", "gma", 0), ("b", "waitk", 1)):
        wait_done(page, pane, 0), wait_done(page, pane, 1)
        with page.expect_download() as got:
            page.click(f"#pane-{pane} .save-vtt")
        assert got.value.suggested_filename == f"captions-{pane}.vtt"
        vtt = Path(got.value.path()).read_text(encoding="utf-8")
        arrivals = page.evaluate(f"window.simulserve.state.panes[{n}].arrivals")
        server_said = sent_by(page, model)
        assert [a["text"] for a in arrivals] == [w["text"] for w in server_said["word"]]   # every word, in order
        assert [a["ms"] for a in arrivals] == sorted(a["ms"] for a in arrivals) and arrivals[0]["ms"] > 0
        assert len({a["sentence"] for a in arrivals}) == 2
        assert vtt == webvtt(as_words(arrivals))
        with page.expect_download() as got:
            page.click(f"#pane-{pane} .save-txt")
        assert Path(got.value.path()).read_text(encoding="utf-8") == \
            "".join(m["translation"] + "\n" for m in server_said["sentence"])
    # the page's cue maker against the Python one: pauses, one step's words, long lines, escapes, emoji
    # and a lost connection's restarts (the sentence sent again, with the later ones)
    rng = __import__("random").Random(3)
    ms, words = 0, []
    for i in range(400):
        ms += rng.choice([0, 1, 200, 700, 4999, 5000, 6000])
        words.append({"sentence": i // 11, "text": rng.choice(["a", "Wort", "longer-words", "<&>", "Zürich", "👋🏽",
                                                                "x" * 41, "y" * 50]), "ms": ms})
        if rng.random() < 0.03:
            words.append({"restart": rng.randint(max(0, i // 11 - 1), i // 11)})
    in_js = page.evaluate("(words) => window.simulserve.webvtt(words)", words)
    assert in_js == webvtt(as_words(words))
    assert sum("restart" in w for w in words) > 3


def as_words(arrivals: list[dict]) -> list[dict]:
    """The page's recorded arrivals as clients/subtitles.py takes them (seconds; restarts as they are)."""
    return [a if "restart" in a else {**a, "received_s": a["ms"] / 1000} for a in arrivals]


def test_a_pane_shares_its_captions_with_viewers(page, server, browser):
    """The pane's "share" box: the stream is shared (mid-stream: no new stream), the viewers' link shown; a viewer
    page on it follows the pane's captions, keeps following when the pane opens a new stream (Reconnect) on the
    same feed, and is told the stream has ended as soon as the box is unticked."""
    open_page(page, server)
    streams = sum(m["type"] == "ready" for _, m in page.frames_in)
    page.check("#pane-a .share")
    page.wait_for_selector("#pane-a .share-link:not(.hidden)")
    assert sent_by(page, "gma")["shared"][0]["share"]["watch"] in page.get_attribute("#pane-a .share-link a", "href")
    assert sum(m["type"] == "ready" for _, m in page.frames_in) == streams   # the stream went on
    link = page.get_attribute("#pane-a .share-link a", "href")
    assert link.startswith(server.url + "/watch/") and link.endswith("/")
    viewer = browser.new_page()
    try:
        viewer.goto(link)
        viewer.wait_for_function("document.querySelector('#status').dataset.state === 'live'")
        say(page, "haus baum licht")
        first = wait_done(page, "a", 0).locator(".translation").inner_text()
        viewer.wait_for_function(f"document.querySelector('#captions').innerText.includes({json.dumps(first)})")
        page.click("#pane-a .reconnect")                 # a new stream, the same feed
        page.wait_for_selector("#pane-a .status[data-state=ready]")
        assert page.get_attribute("#pane-a .share-link a", "href") == link
        say(page, "wald stein")
        second = wait_done(page, "a", 1).locator(".translation").inner_text()
        viewer.wait_for_function(f"document.querySelector('#captions').innerText.includes({json.dumps(second)})")
        lines = [t.strip() for t in viewer.locator("#captions .line").all_inner_texts()]
        assert lines == [first, second]
        assert sent_by(page, "gma")["ready"][0]["share"]["url"] == link[len(server.url):]
        page.uncheck("#pane-a .share")                   # the feed ends now, not after the grace time
        viewer.wait_for_selector("#status[data-state=ended]", timeout=5000)
        page.wait_for_selector("#pane-a .share-link.hidden", state="attached")
        assert sent_by(page, "gma")["shared"][-1]["share"] is None
    finally:
        viewer.close()


@pytest.fixture(scope="module")
def limited_server(trained, tmp_path_factory):
    """Sentences of at most 3 words: with auto_segment the server ends a longer one by itself (sentence_cut)."""
    srv = ServerProcess({"waitk": trained["waitk"]}, tmp_path_factory.mktemp("limited_server") / "server.log",
                        extra=("--max-words-per-sentence", "3", "--engines", "1"))
    srv.start()
    yield srv
    srv.stop()


def one_pane(browser, server, query: str):
    context = browser.new_context(viewport={"width": 1000, "height": 900})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.js_errors, page.frames_in = [], []
    page.on("pageerror", lambda e: page.js_errors.append(str(e)))
    page.on("websocket", lambda ws: ws.on("framereceived", lambda p: page.frames_in.append((1, json.loads(p)))))
    page.goto(f"{server.url}/?compare=0&a=waitk&{query}")
    page.fill("#api-key", KEY)
    page.dispatch_event("#api-key", "change")
    page.wait_for_selector("#pane-a .status[data-state=ready]")
    return context, page


def sources(page) -> list[str]:
    """The source words of each of pane A's sentences, oldest first."""
    return page.eval_on_selector_all("#pane-a li.sentence", "lis => lis.reverse().map(li => "
                                     "[...li.querySelectorAll('.col:not(.end) .src')].map(s => s.textContent)"
                                     ".join(' '))")


def test_a_pause_ends_the_sentence_when_the_page_asks(browser, limited_server):
    context, page = one_pane(browser, limited_server, "pause=1")
    try:
        assert page.input_value("#pause") == "1"
        assert [m for _, m in page.frames_in if m["type"] == "ready"][-1]["end_after_pause_s"] == 1
        page.click("#live-input")
        page.keyboard.type("haus baum ", delay=15)       # no full stop, no Enter: the pause ends it
        assert wait_done(page, "a", 0).locator(".translation").inner_text() == "haus baum"
        assert page.input_value("#live-input") == ""     # the box holds the open sentence only
        page.keyboard.type("licht ", delay=15)
        wait_done(page, "a", 1)
        assert sources(page) == ["haus baum", "licht"]
    finally:
        context.close()
    assert not page.js_errors, page.js_errors


def test_words_after_the_servers_own_end_stay_in_the_next_sentence(browser, limited_server):
    """The server cuts a 5-word sentence after 3 (sentence_cut); the last two are its next sentence's, and a
    word typed after that sentence's first translated word joins it, not a sentence of its own."""
    context, page = one_pane(browser, limited_server, "")
    try:
        page.fill("#pane-a .knob-value", "1")            # wait-k 1: the next sentence's first word is written at once
        page.dispatch_event("#pane-a .knob-value", "change")
        page.wait_for_function("document.querySelector('#pane-a .status').textContent.includes('k=1')")
        page.fill("#live-input", "haus baum licht wald stein ")   # one message: all five reach the page's sentence
        wait_done(page, "a", 0)
        page.wait_for_selector(sentence(page, "a", 1) + " .tgt")
        say(page, "berg")
        assert wait_done(page, "a", 1).locator(".translation").inner_text() == "wald stein berg"
        assert sources(page) == ["haus baum licht", "wald stein berg"]
    finally:
        context.close()
    assert not page.js_errors, page.js_errors


@pytest.fixture(scope="module")
def busy_server(trained, tmp_path_factory):
    """A delay budget no stream meets: admission by headroom keeps one stream at a time (in one engine process:
    with the CPU's default of two, each engine's admission would let one in)."""
    srv = ServerProcess({"gma": trained["gma"]}, tmp_path_factory.mktemp("busy_server") / "server.log",
                        extra=("--delay-budget-ms", "0.001", "--admission-retry-max-s", "2", "--engines", "1"))
    srv.start()
    yield srv
    srv.stop()


def test_server_busy_is_shown_then_retried_after_retry_after(browser, busy_server):
    from websockets.sync.client import connect
    context = browser.new_context(viewport={"width": 1000, "height": 900})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    with connect(busy_server.url.replace("http", "ws") + "/v1/stream",
                 additional_headers={"Authorization": f"Bearer {KEY}"}) as holder:
        # one stream translates a sentence (the engine measures it) and stays: the budget allows no other
        holder.send(json.dumps({"type": "start", "model": "gma"}))
        assert json.loads(holder.recv())["type"] == "ready"
        holder.send(json.dumps({"type": "words", "words": ["haus", "baum"]}))
        holder.send(json.dumps({"type": "end_sentence"}))
        while json.loads(holder.recv())["type"] != "sentence":
            pass
        deadline = time.monotonic() + 10
        while httpx.get(busy_server.url + "/health").json()["headroom"]["models"]["gma"]["state"] == "cold":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        page.goto(busy_server.url + "/?compare=0")
        page.fill("#api-key", KEY)
        page.dispatch_event("#api-key", "change")
        page.wait_for_selector("#pane-a[data-error=server_busy]")
        alert = page.inner_text("#pane-a .alert")
        assert "real-time capacity" in alert and "Reconnecting in" in alert
        assert page.inner_text("#pane-a .status") == "server busy"
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "caption_page_busy.png"), full_page=True)
    try:   # the share is free: the page gets in by itself, after the server's retry_after
        page.wait_for_selector("#pane-a .status[data-state=ready]")
        say(page, "haus baum licht")
        assert wait_done(page, "a", 0).locator(".translation").inner_text() == "haus baum licht"
    finally:
        context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


@pytest.fixture(scope="module")
def shipped_server(tmp_path_factory):
    """`simulserve serve` with no model arguments: every shipped De→En checkpoint."""
    from models.shipped import shipped_checkpoints
    if not {"gma_delta1", "waitk"} <= set(shipped_checkpoints()):
        pytest.fail("the shipped gma_delta1 and waitk checkpoints are missing")
    srv = ServerProcess({}, tmp_path_factory.mktemp("shipped_server") / "server.log")
    srv.start()
    yield srv
    srv.stop()


def test_shipped_models_caption_german_in_english(browser, shipped_server):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(60_000)
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        open_page(page, shipped_server)
        assert page.input_value("#pane-a select.model") == "gma_delta1"
        assert page.input_value("#pane-b select.model") == "waitk"
        say(page, "Im Anfang schuf Gott den Himmel und die Erde.")
        say(page, "Klicken Sie auf die Schaltfläche OK.")
        say(page, "Der Zug hat zehn Minuten Verspätung.")   # everyday German (issue 13)
        for pane in ("a", "b"):
            first = wait_done(page, pane, 0).locator(".translation").inner_text().lower()
            second = wait_done(page, pane, 1).locator(".translation").inner_text().lower()
            third = wait_done(page, pane, 2).locator(".translation").inner_text().lower()
            assert "god" in first and "earth" in first, (pane, first)
            assert "click" in second, (pane, second)
            assert "train" in third and "ten minutes" in third, (pane, third)
        ARTIFACTS.mkdir(exist_ok=True)
        # the README's picture (docs/caption_page.png) is this screenshot
        page.screenshot(path=str(ARTIFACTS / "caption_page_shipped.png"), full_page=True)
    finally:
        context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"
