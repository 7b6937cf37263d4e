"""Protection below the websocket handler: the HTTP request head, websocket frames, per-IP limits, logs.

- `GuardedHttpProtocol` (uvicorn's httptools protocol): the request head is limited in bytes
  (431), in header count (431) and in time (a silent or trickling connection is closed after
  `request_head_timeout_s`); without it a 100 MB header was buffered whole and a silent TCP
  connection was kept forever.
- `GuardedWebSocketProtocol`: pings share the connection's rate limit (a `TokenBucket` handed to
  the app in the scope), a text frame that is not UTF-8 is closed with 1007 and one log line,
  and a connection whose client stops reading is aborted once the app has finished with it.
- `IpLimits`: concurrent websocket connections and failed authentications per client address.
- `RedactKeys`: API keys sent as `?token=` never reach a log line (uvicorn's included).
"""
from __future__ import annotations

import base64
import binascii
import logging
import re
import time
from collections import defaultdict, deque
from typing import Callable

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

log = logging.getLogger("simulserve.server")
SUBPROTOCOL = "simulserve.v1"          # what the server accepts when a browser offers subprotocols
KEY_SUBPROTOCOL = "simulserve.key."    # + base64url(key): how a browser sends its key (no headers there)
RATE_EXTENSION = "simulserve.rate"     # scope["extensions"] entry: the connection's TokenBucket


# ---------------------------------------------------------------- rate and per-IP limits
class TokenBucket:
    """`rate` events per second on average, `burst` at once."""

    def __init__(self, rate: float, burst: int):
        self.rate, self.burst = rate, burst
        self.tokens, self.t = float(burst), time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
        self.t = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class IpLimits:
    """Open websocket connections and recent failed authentications, per client address.

    Memory stays bounded: an address is forgotten when its last connection closes and its
    failures have aged out of the window."""

    def __init__(self, max_connections: int, max_failures: int, window_s: float):
        self.max_connections, self.max_failures, self.window = max_connections, max_failures, window_s
        self.connections: dict[str, int] = defaultdict(int)
        self.failures: dict[str, deque] = {}

    def connect(self, ip: str) -> bool:
        """Count a new connection; False (not counted) if the address has too many open."""
        if self.max_connections and self.connections[ip] >= self.max_connections:
            if not self.connections[ip]:
                del self.connections[ip]
            return False
        self.connections[ip] += 1
        return True

    def disconnect(self, ip: str) -> None:
        self.connections[ip] -= 1
        if self.connections[ip] <= 0:
            del self.connections[ip]

    def _recent(self, ip: str, now: float) -> deque | None:
        q = self.failures.get(ip)
        if q is not None:
            while q and q[0] <= now - self.window:
                q.popleft()
            if not q:
                del self.failures[ip]
                return None
        return q

    def auth_blocked(self, ip: str) -> bool:
        q = self._recent(ip, time.monotonic())
        return bool(self.max_failures) and q is not None and len(q) >= self.max_failures

    def auth_failed(self, ip: str) -> None:
        now = time.monotonic()
        if len(self.failures) > 10000:          # many addresses: drop those whose failures aged out
            for other in list(self.failures):
                self._recent(other, now)
        q = self._recent(ip, now)
        if q is None:
            q = self.failures[ip] = deque(maxlen=max(self.max_failures, 1))
        q.append(now)


def key_from_subprotocols(offered: list[str]) -> str | None:
    """The API key a browser put in its offered subprotocols (`simulserve.key.<base64url>`)."""
    for p in offered:
        if p.startswith(KEY_SUBPROTOCOL):
            raw = p[len(KEY_SUBPROTOCOL):]
            try:
                return base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode("utf-8")
            except (binascii.Error, ValueError):
                return None
    return None


# ---------------------------------------------------------------- logs
_SECRET_QUERY = re.compile(r"([?&](?:token|api_key|key)=)[^&\s\"']*", re.I)
_SECRET_PROTOCOL = re.compile(re.escape(KEY_SUBPROTOCOL) + r"[A-Za-z0-9_\-=]+")


def redact(text: str) -> str:
    return _SECRET_PROTOCOL.sub(KEY_SUBPROTOCOL + "[redacted]", _SECRET_QUERY.sub(r"\1[redacted]", text))


class RedactKeys(logging.Filter):
    """Rewrites a record whose message carries a key (uvicorn logs the path with its query)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken record is the logging module's business
            return True
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


def install_log_redaction() -> None:
    """On the loggers that print request paths; logger filters survive uvicorn's dictConfig."""
    for name in ("uvicorn.error", "uvicorn.access", "uvicorn", "simulserve.server"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactKeys) for f in logger.filters):
            logger.addFilter(RedactKeys())


# ---------------------------------------------------------------- protocols
def _refusal(status: int, reason: str) -> bytes:
    body = reason.encode()
    phrase = {408: "Request Timeout", 431: "Request Header Fields Too Large"}[status]
    return (f"HTTP/1.1 {status} {phrase}\r\ncontent-type: text/plain; charset=utf-8\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


def make_http_protocol(settings, refused: Callable[[str], None], stopping: Callable[[], None] = lambda: None):
    """uvicorn's httptools protocol with a bounded, timed request head. `stopping()` is called when the server
    stops (SIGTERM), before it waits for open responses: the shared captions' viewers (endless responses) end."""
    limits = settings.limits
    max_bytes, max_headers, timeout = limits.max_header_bytes, limits.max_headers, limits.request_head_timeout_s

    class GuardedHttpProtocol(HttpToolsProtocol):
        def shutdown(self) -> None:
            stopping()
            super().shutdown()

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._refused: str | None = None
            self._head_timer = None
            self._start_head()

        def _start_head(self) -> None:
            self._in_head, self._head_bytes, self._n_headers = True, 0, 0
            self._cancel_head_timer()
            self._head_timer = self.loop.call_later(timeout, self._head_timeout)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timeout(self) -> None:
            self._head_timer = None
            if self._in_head and not self.transport.is_closing():
                refused("head_timeout")
                if self._head_bytes:
                    self.transport.write(_refusal(408, "request head not received in time"))
                self.transport.close()

        def _refuse(self, reason: str) -> None:
            refused(reason)
            self._cancel_head_timer()
            self._in_head = False
            what = "too many headers" if reason == "too_many_headers" else "request head too large"
            self.transport.write(_refusal(431, f"{what}: at most {max_headers} headers, {max_bytes} bytes"))
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self.transport.is_closing():
                return
            if self._in_head:
                self._head_bytes += len(data)
                if self._head_bytes > max_bytes:
                    return self._refuse("header_too_large")
            super().data_received(data)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._n_headers += 1
            if self._n_headers > max_headers:
                self._refused = "too_many_headers"
                raise ValueError("too many headers")   # stops the parser; answered in send_400_response
            super().on_header(name, value)

        def send_400_response(self, msg: str) -> None:
            if self._refused:
                return self._refuse(self._refused)
            super().send_400_response(msg)

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._cancel_head_timer()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # a kept-alive connection's next head is timed too (unless it came already, pipelined)
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self._start_head()

        def connection_lost(self, exc) -> None:
            self._cancel_head_timer()
            super().connection_lost(exc)

    return GuardedHttpProtocol


def make_ws_protocol(settings, refused: Callable[[str], None]):
    """uvicorn's websockets protocol: pings rate-limited, bad UTF-8 closed quietly, stuck sockets aborted."""
    rate, burst = settings.limits.rate_limit, settings.limits.rate_burst

    class GuardedWebSocketProtocol(WebSocketsSansIOProtocol):
        def handle_connect(self, event) -> None:
            self.bucket = TokenBucket(rate, burst)
            super().handle_connect(event)
            if hasattr(self, "scope"):
                self.scope["extensions"][RATE_EXTENSION] = self.bucket

        def handle_ping(self) -> None:
            if self.close_sent:
                return
            if not self.bucket.take():
                refused("ping_flood")
                self.conn.fail(1008, "rate limited")
                self.handle_parser_exception()
                return
            super().handle_ping()

        def send_receive_event_to_app(self) -> None:
            if self.curr_msg_data_type == "text" and not self.close_sent:
                try:
                    b"".join(self.frames).decode()
                except UnicodeDecodeError:
                    self.frames = []
                    client = "%s:%d" % self.client if self.client else "?"
                    log.warning("%s - a websocket text frame was not UTF-8: closed (1007)", client)
                    refused("invalid_utf8")
                    self.conn.send_close(1007, "invalid UTF-8")
                    self.handle_parser_exception()
                    return
            super().send_receive_event_to_app()

        async def run_asgi(self) -> None:
            await super().run_asgi()
            # a client that reads nothing keeps the close frame (and the socket) in our buffer forever
            self.loop.call_later(self.close_timeout or 5.0, self._abort_if_open)

        def _abort_if_open(self) -> None:
            if not self.disconnected:
                self.transport.abort()

        def shutdown(self) -> None:
            """The server stopping (SIGTERM): the close 1012 as uvicorn sends it, then the closing handshake
            as after the app's own close, reading until the peer echoes it (or close_timeout), instead of
            closing the socket at once. A socket closed with words still unread sends a reset, which the
            client (or a proxy between) could take before the close frame: a client that was sending saw
            1006, a dropped connection, instead of 1012."""
            if not self.handshake_complete or self.close_sent or self.transport.is_closing():
                super().shutdown()
                return
            self.stop_keepalive()
            self.queue.put_nowait({"type": "websocket.disconnect", "code": 1012})
            self.conn.send_close(1012)
            self.transport.write(b"".join(self.conn.data_to_send()))
            self.close_sent = True
            if self.read_paused:   # (the echo must be read)
                self.read_paused = False
                self.transport.resume_reading()
            self.close_timer = self.loop.call_later(self.close_timeout or 5.0, self.transport.close)

    return GuardedWebSocketProtocol


def uvicorn_config(app, settings, **kw) -> uvicorn.Config:
    """The uvicorn settings every server uses (the CLI and the tests): guarded protocols, sizes."""
    srv = app.state.server

    def refused(reason: str) -> None:
        srv.metrics.refusals.labels(reason).inc()

    install_log_redaction()
    if settings.transport.forwarded_allow_ips is not None:
        kw.setdefault("forwarded_allow_ips", settings.transport.forwarded_allow_ips)
    return uvicorn.Config(app, http=make_http_protocol(settings, refused, srv.shares.viewers.stop),
                          ws=make_ws_protocol(settings, refused),
                          ws_max_size=4 * settings.limits.max_message_bytes + 1024,
                          ws_per_message_deflate=settings.transport.ws_compression, **kw)
