"""Captions for an audience (`simulserve stream --serve-captions [HOST:]PORT`): the client shows the live
translation to viewers' browsers.

A talk's captions are wanted on a projector and on people's phones, not in the captioner's terminal. The client
already receives every word, so it serves them itself: a small HTTP server (standard library, a thread per
viewer) with a full-screen caption page at `/` and a Server-Sent Events feed at `/events`. Each event is the
roll-up text the subtitles show (server/caption_lines.py: the last two lines), sent when a word arrives; a
viewer who joins late gets the current text at once; the last event says the stream has ended. Viewers only
read: nothing they send reaches the translation server, which serves this one stream as any other.
"""
from __future__ import annotations

import queue
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from server.caption_lines import KEEPALIVE_TEXT, CaptionLines, sse_text

VIEWER = Path(__file__).resolve().parent / "web" / "viewer.html"
MAX_VIEWERS = 200          # more are refused (503): each holds a thread
KEEPALIVE_S = 15.0         # an SSE comment this often keeps proxies from closing an idle feed
VIEWER_QUEUE = 1000        # events a viewer may lag behind before it is dropped (it reconnects and resyncs)


class CaptionFeed:
    """The current roll-up text and the viewers' queues; `word`, `restart` and `end` come from the client's
    event loop, viewers read on their own threads."""

    def __init__(self) -> None:
        self.lines = CaptionLines()
        self.lock = threading.Lock()
        self.viewers: set[queue.Queue] = set()
        self.event = {"lines": [], "ended": False}
        self.served = 0            # viewers who connected so far

    def _publish(self, event: dict) -> None:
        with self.lock:
            self.event = event
            for q in list(self.viewers):
                try:
                    q.put_nowait(event)
                except queue.Full:          # a viewer that does not read: drop it (its page reconnects)
                    self.viewers.discard(q)
                    try:
                        q.get_nowait()
                    except queue.Empty:
                        pass
                    q.put_nowait(None)

    def word(self, msg: dict) -> None:
        self.lines.add(msg["sentence"], msg["text"])
        self._publish({"lines": self.lines.shown(), "ended": False})

    def restart(self, sentence: int) -> None:
        self.lines.restart(sentence)

    def end(self) -> None:
        self._publish({"lines": self.event["lines"], "ended": True})

    def subscribe(self) -> queue.Queue | None:
        with self.lock:
            if len(self.viewers) >= MAX_VIEWERS:
                return None
            q: queue.Queue = queue.Queue(VIEWER_QUEUE)
            q.put_nowait(self.event)       # the current text first: a late viewer sees the caption at once
            self.viewers.add(q)
            self.served += 1
            return q

    def unsubscribe(self, q: queue.Queue) -> None:
        with self.lock:
            self.viewers.discard(q)


def _handler(feed: CaptionFeed):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:   # (the captioner's terminal shows captions, not requests)
            pass

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/", "/index.html"):
                body = VIEWER.read_bytes()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            elif path == "/events":
                self._events()
            else:
                self.send_error(404)

        def _events(self) -> None:
            q = feed.subscribe()
            if q is None:
                self.send_error(503, f"at most {MAX_VIEWERS} viewers")
                return
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                while True:
                    try:
                        event = q.get(timeout=KEEPALIVE_S)
                    except queue.Empty:
                        self.wfile.write(KEEPALIVE_TEXT.encode())
                        self.wfile.flush()
                        continue
                    if event is None:
                        return
                    self.wfile.write(sse_text(event).encode())
                    self.wfile.flush()
                    if event["ended"]:
                        return
            except OSError:                 # the viewer went away
                return
            finally:
                feed.unsubscribe(q)
    return Handler


class CaptionServer:
    """The HTTP server for `feed` on (host, port), in a daemon thread; port 0 takes a free one (`url` says)."""

    def __init__(self, feed: CaptionFeed, host: str = "127.0.0.1", port: int = 0):
        self.httpd = ThreadingHTTPServer((host, port), _handler(feed))
        self.httpd.daemon_threads = True
        self.url = f"http://{host}:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def start(self) -> "CaptionServer":
        self.thread.start()
        return self

    def close(self, feed: CaptionFeed | None = None, grace_s: float = 2.0) -> None:
        """Stop serving; with `feed`, first give its viewers up to `grace_s` to read the last event."""
        deadline = time.monotonic() + grace_s
        while feed is not None and feed.viewers and time.monotonic() < deadline:
            time.sleep(0.02)
        self.httpd.shutdown()
        self.httpd.server_close()


def parse_address(value: str) -> tuple[str, int]:
    """`PORT` (on 127.0.0.1) or `HOST:PORT`; ValueError saying what is wrong."""
    host, _, port = value.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"--serve-captions {value!r}: give PORT or HOST:PORT") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"--serve-captions {value!r}: the port must be 0-65535")
    return host.strip("[]") or "127.0.0.1", number
