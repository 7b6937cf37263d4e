"""Issue 15: the server against hostile or careless clients, on a real uvicorn server on a loopback port.

Each test is one defect of the issue: a client that never reads, lone surrogates, the key in the log,
an empty key, oversized headers, slots held without `start` or with junk, silent TCP sockets, and the
smaller items (long words, `model: ""`, HEAD, bad UTF-8, pings, the cache pool that only grew).
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from conftest import ROOT
from models.cache_pool import CachePool
from server.settings import SettingsError, load_settings
from server.bench import wait_healthy
from test_server import LiveServer, codes, talk
from test_server_limits import START, TAIL, reference  # noqa: F401 - `reference` is a fixture

KEY = "hardening-key"


@pytest.fixture(scope="module")
def server(trained):
    with LiveServer(models={"waitk": str(trained["waitk"])}, max_streams=6, start_timeout_s=1.0,
                    idle_timeout_s=1.5, max_output_messages=50, rate_limit=5000, rate_burst=5000,
                    max_connections_per_ip=4, request_head_timeout_s=1.0, max_header_bytes=8192,
                    max_headers=50) as srv:
        yield srv


def translated(received) -> list[str]:
    return [m["translation"] for m in received if m["type"] == "sentence"]


async def closed(ws, timeout: float = 10) -> int | None:
    """Read until the server closes; the close code."""
    try:
        async with asyncio.timeout(timeout):
            async for _ in ws:
                pass
    except ConnectionClosed:
        pass
    return ws.close_code


# ---------------------------------------------------------------- 1. a client that never reads
def test_error_replies_to_a_client_that_never_reads_are_bounded(trained):
    """Bad messages without reading: the error replies count against the unsent-message limits and
    the connection is dropped as `slow_consumer` (before: the queue grew without bound). A sans-I/O
    client on a blocking socket really reads nothing after the handshake, and small kernel buffers on
    both ends stand for a slow network, so the server's own queue fills within seconds."""
    srv = LiveServer(models={"waitk": str(trained["waitk"])}, max_output_messages=50, rate_limit=5000,
                     rate_burst=5000)
    srv.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)   # accepted sockets inherit it
    with srv:
        def main():
            from websockets.client import ClientProtocol
            from websockets.uri import parse_uri
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", srv.port))
            ws = ClientProtocol(parse_uri(srv.url))
            ws.send_request(ws.connect())
            sock.sendall(b"".join(ws.data_to_send()))
            while not ws.events_received():            # the handshake is the last thing we read
                ws.receive_data(sock.recv(4096))
            junk = json.dumps({"type": "bogus", "id": "i" * 100, "pad": "p" * 3000}).encode()
            sent, deadline = 0, time.monotonic() + 40
            sock.settimeout(5)
            try:   # our sends are buffered too: give the server time to read them
                for frame in [json.dumps(START).encode()] + [junk] * 3000:
                    ws.send_text(frame)
                    sock.sendall(b"".join(ws.data_to_send()))
                    sent += 1
                    if sent % 100 == 0 and srv.metric("simulserve_errors_total", code="slow_consumer"):
                        break
            except OSError:
                pass
            while not srv.metric("simulserve_errors_total", code="slow_consumer") and time.monotonic() < deadline:
                time.sleep(0.1)
            sock.close()
            return sent

        sent = main()
        assert srv.wait_metric("simulserve_errors_total", 1, code="slow_consumer") == 1, sent
        assert srv.wait_metric("simulserve_active_streams", 0) == 0      # the slot is free again
        assert httpx.get(srv.http + "/health").status_code == 200


def test_long_ids_and_values_are_not_echoed_in_full(server):
    """A reply must not be as large as the message that caused it (before: a 16 KB `id` came back)."""
    msgs = [{"type": "bogus", "id": "i" * 5000}, {"type": "x" * 5000}, {"type": "words", "words": [], "y" * 5000: 1},
            {"type": "words", "words": ["haus"], "id": "short"}]
    received, _ = asyncio.run(talk(server.url, msgs))
    errors = [m for m in received if m["type"] == "error"]
    assert [e["code"] for e in errors] == ["unknown_type", "unknown_type", "bad_message", "not_started",
                                           "start_timeout"]
    assert all(len(json.dumps(e)) < 700 for e in errors) and errors[3]["id"] == "short"


# ---------------------------------------------------------------- 2. lone surrogates
SURROGATE_CASES = {  # raw frames: a lone surrogate in every string field (and a key)
    "bogus_id": '{"type": "bogus", "id": "\\ud800"}',
    "start_id": '{"type": "start", "model": "waitk", "id": "\\udfff"}',
    "start_model": '{"type": "start", "model": "wait\\ud800k"}',
    "words_id": '{"type": "words", "words": ["haus"], "id": "\\ud800"}',
    "words": '{"type": "words", "words": ["ha\\ud800us"]}',
    "text": '{"type": "text", "text": "\\ud800 "}',
    "end_id": '{"type": "end_sentence", "id": "\\ud800"}',
    "key": '{"type": "words", "words": ["haus"], "\\ud800": 1}',
    "type": '{"type": "\\ud800"}',
}


@pytest.mark.parametrize("name", list(SURROGATE_CASES))
def test_a_lone_surrogate_anywhere_is_a_bad_message_and_the_stream_goes_on(name, server, reference):
    """Before: the error reply echoed the surrogate, could not be encoded, and the connection dropped
    without a close frame, mid-sentence included."""
    first = [SURROGATE_CASES[name], START] if "start" in name else [START, {"type": "words", "words": ["haus"]},
                                                                    SURROGATE_CASES[name]]
    tail = TAIL if "start" in name else [{"type": "words", "words": ["baum"]}, {"type": "end_stream"}]
    received, code = asyncio.run(talk(server.url, first + tail))
    assert codes(received) == ["bad_message"], received
    assert code == 1000 and translated(received) == [reference("waitk", {"k": 2}, "haus baum").prediction]
    assert "id" not in [m for m in received if m["type"] == "error"][0]


# ---------------------------------------------------------------- 3 + 4. keys: logs, empty keys, subprotocol
def _serve_cli(trained, *extra, env=None) -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "clients.cli", "serve", f"waitk={trained['waitk']}", "--port", str(port),
           "--no-warmup", "--torch-threads", "1", "--step", "default", *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True), port


def test_the_key_never_reaches_the_log_and_a_browser_sends_it_as_a_subprotocol(trained):
    """`simulserve serve --log-level info`: uvicorn's own websocket lines carried ?token=KEY in clear,
    for right and wrong keys alike."""
    proc, port = _serve_cli(trained, "--api-key", KEY, "--log-level", "info")
    url = f"ws://127.0.0.1:{port}/v1/stream"
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, timeout=60)
        key_protocol = "simulserve.key." + base64.urlsafe_b64encode(KEY.encode()).decode().rstrip("=")

        async def main():
            good = await talk(url + f"?token={KEY}", [START] + TAIL)
            wrong = await talk(url + "?token=wrong-guess-123", [START] + TAIL)
            async with connect(url, subprotocols=["simulserve.v1", key_protocol]) as ws:
                chosen = ws.subprotocol
                await ws.send(json.dumps(START))
                ready = json.loads(await ws.recv())
            return good, wrong, chosen, ready

        (good, good_code), (wrong, _), chosen, ready = asyncio.run(main())
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0]
    assert good_code == 1000 and good[-1]["type"] == "end" and codes(wrong) == ["unauthorized"]
    assert chosen == "simulserve.v1" and ready["type"] == "ready"      # never the key's subprotocol
    assert "[accepted]" in out and "token=[redacted]" in out, out
    assert KEY not in out and "wrong-guess-123" not in out, out


def test_an_empty_api_key_is_refused_at_start_up(trained, monkeypatch):
    """Before: `--api-key ""` (an unset shell variable) served everyone while auth looked on."""
    proc, _ = _serve_cli(trained, "--api-key", "")
    try:
        out = proc.communicate(timeout=60)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the server started with an empty API key")
    assert proc.returncode == 2 and "API key is empty" in out, out
    for env in ('[""]', '["good", "  "]'):
        monkeypatch.setenv("SIMULSERVE_API_KEYS", env)
        with pytest.raises(SettingsError, match="API key is empty"):
            load_settings()
    monkeypatch.setenv("SIMULSERVE_API_KEYS", "good")
    assert load_settings().api_keys == ["good"]


def test_removed_settings_fail_naming_the_setting(tmp_path, monkeypatch, capsys):
    """`tail_burst_ms` and `continuations` were removed (they measured worse): a settings file, an
    environment variable or a flag that still sets one stops the server with its name."""
    from clients.cli import main
    for name, value in (("tail_burst_ms", "20"), ("continuations", "3")):
        yaml = tmp_path / f"{name}.yaml"
        yaml.write_text(f"{name}: {value}\n")
        with pytest.raises(SettingsError, match=rf"(?s){name}.*Extra inputs.*{name}: removed"):
            load_settings(yaml)
        monkeypatch.setenv(f"SIMULSERVE_{name.upper()}", value)
        with pytest.raises(SettingsError, match=f"SIMULSERVE_{name.upper()} \\(removed"):
            load_settings()
        monkeypatch.delenv(f"SIMULSERVE_{name.upper()}")
        flag = "--" + name.replace("_", "-")
        with pytest.raises(SystemExit) as exit_:
            main(["serve", flag, value])
        assert exit_.value.code == 2 and f"unrecognized arguments: {flag}" in capsys.readouterr().err
    assert load_settings().max_batch == 256


# ---------------------------------------------------------------- 5 + 7. request heads: size, count, time
def _raw(port: int, data: bytes, *, trickle: float = 0.0, timeout: float = 10) -> tuple[bytes, float]:
    """Send `data` on a plain TCP socket (byte by byte every `trickle` s); the reply and when it ended."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(timeout)
        try:
            if trickle:
                for b in data:
                    s.sendall(bytes([b]))
                    time.sleep(trickle)
            else:
                s.sendall(data)
        except OSError:       # closed by the server while we were still sending
            pass
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (ConnectionResetError, socket.timeout):
            pass
    return out, time.monotonic() - t0


def test_oversized_and_numerous_headers_get_431_and_health_stays_fast(server):
    big = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 2_000_000 + b"\r\n\r\n"
    many = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(60)) + b"\r\n"
    ok = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Fine: " + b"a" * 4000 + b"\r\n\r\n"
    before = server.metric("simulserve_refusals_total", reason="header_too_large")
    for data, status in ((big, b"431"), (many, b"431"), (ok, b"200")):
        reply, _ = _raw(server.port, data)
        assert reply.split(b" ", 2)[1] == status, reply[:200]
    ws_big = (f"GET /v1/stream HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              f"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
              f"Cookie: {'c' * 20000}\r\n\r\n").encode()
    assert _raw(server.port, ws_big)[0].startswith(b"HTTP/1.1 431")
    assert server.metric("simulserve_refusals_total", reason="header_too_large") == before + 2
    assert server.metric("simulserve_refusals_total", reason="too_many_headers") >= 1
    t0 = time.monotonic()
    assert httpx.get(server.http + "/health").status_code == 200 and time.monotonic() - t0 < 1


def test_silent_and_trickling_connections_are_closed(server):
    """Before: a TCP connection that sent nothing, or a head one byte at a time, was kept forever."""
    silent, t_silent = _raw(server.port, b"")
    trickled, t_trickle = _raw(server.port, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 100,
                               trickle=0.05)
    assert silent == b"" and t_silent < 5
    assert trickled.startswith(b"HTTP/1.1 408") and t_trickle < 5
    assert server.metric("simulserve_refusals_total", reason="head_timeout") >= 2
    # a kept-alive connection that goes silent after a request is closed too
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.settimeout(10)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        t0, out = time.monotonic(), b""
        while chunk := s.recv(65536):
            out += chunk
        assert out.startswith(b"HTTP/1.1 200") and time.monotonic() - t0 < 8


# ---------------------------------------------------------------- 6. slots, per-address limits
def test_connections_without_start_or_with_only_junk_do_not_hold_slots(server, reference):
    """Before: never sending `start` held a slot forever, and junk reset the idle timer."""
    async def silent():
        async with connect(server.url) as ws:
            return [json.loads(m) async for m in _until_closed(ws)], ws.close_code

    async def junk_keepalive():
        async with connect(server.url) as ws:
            await ws.send(json.dumps(START))
            t0 = time.monotonic()
            try:
                while time.monotonic() - t0 < 10:
                    await ws.send("not json")
                    await asyncio.sleep(0.2)
            except ConnectionClosed:
                pass
            return time.monotonic() - t0, ws.close_code

    async def main():
        return await asyncio.gather(silent(), silent(), junk_keepalive())

    (s1, c1), _, (held, junk_code) = asyncio.run(main())
    assert codes(s1) == ["start_timeout"] and c1 == 1008
    assert junk_code == 1001 and held < 5          # idle_timeout_s=1.5 despite the junk
    assert server.wait_metric("simulserve_active_streams", 0) == 0
    received, code = asyncio.run(talk(server.url, [START] + TAIL))
    assert code == 1000 and translated(received) == [reference("waitk", {"k": 2}, "haus baum").prediction]


async def _until_closed(ws):
    try:
        async for m in ws:
            yield m
    except ConnectionClosed:
        return


def test_a_client_waiting_for_its_translation_is_not_idle(trained):
    """The idle timer is about the client: while the engine still owes it words (input unread, an
    ended sentence or end_stream not yet done) a silent client is waiting, not idle."""
    words = [f"w{i % 7}" for i in range(30)]
    msgs = [{"type": "start", "model": "waitk", "k": 1}]
    for _ in range(12):
        msgs += [{"type": "words", "words": words}, {"type": "end_sentence"}]
    with LiveServer(models={"waitk": str(trained["waitk"])}, idle_timeout_s=0.3, max_backlog_words=512,
                    max_words_per_sentence=40, max_batch=1) as srv:
        t0 = time.monotonic()
        received, code = asyncio.run(talk(srv.url, msgs + [{"type": "end_stream"}]))
        took = time.monotonic() - t0
    assert not codes(received) and code == 1000, (codes(received), took)
    assert len(translated(received)) == 12


def test_connections_per_address_are_limited_and_other_addresses_get_in(server):
    before = server.metric("simulserve_refusals_total", reason="ip_connections")

    async def main():
        held = [await connect(server.url) for _ in range(4)]     # max_connections_per_ip=4
        extra = await talk(server.url, [START] + TAIL)
        other = await talk(server.url, [START] + TAIL, local_addr=("127.0.0.2", 0))
        for ws in held:
            await ws.close()
        return extra, other

    (extra, extra_code), (other, other_code) = asyncio.run(main())
    assert codes(extra) == ["too_many_connections"] and extra_code == 1013
    assert other_code == 1000 and other[-1]["type"] == "end"
    assert server.metric("simulserve_refusals_total", reason="ip_connections") == before + 1


def test_a_trusted_proxy_gives_the_client_address(trained):
    """Behind a proxy on another address, X-Forwarded-For names the client for the per-address limits."""
    with LiveServer(models={"waitk": str(trained["waitk"])}, max_connections_per_ip=1,
                    forwarded_allow_ips="127.0.0.9") as srv:
        async def main():
            proxy = {"local_addr": ("127.0.0.9", 0)}
            a = await connect(srv.url, additional_headers={"X-Forwarded-For": "10.0.0.1"}, **proxy)
            b = await talk(srv.url, [START] + TAIL, additional_headers={"X-Forwarded-For": "10.0.0.2"}, **proxy)
            c = await talk(srv.url, [START] + TAIL, additional_headers={"X-Forwarded-For": "10.0.0.1"}, **proxy)
            await a.close()
            return b, c

        (b, b_code), (c, _) = asyncio.run(main())
        assert b_code == 1000 and b[-1]["type"] == "end"           # another client behind the same proxy
        assert codes(c) == ["too_many_connections"]               # the same client twice


def failed_keys_per_address_are_limited(srv, key: str = KEY) -> None:
    """Against a server with api_keys=[key], max_auth_failures_per_ip=3 (also test_workers.py's, several processes):
    three wrong keys from one address, then that address is refused even with the right key; another gets in."""
    auth = {"additional_headers": {"Authorization": f"Bearer {key}"}}

    async def main():
        wrong = [await talk(srv.url + f"?token=guess{i}", [START]) for i in range(5)]
        right_here = await talk(srv.url, [START] + TAIL, **auth)
        right_elsewhere = await talk(srv.url, [START] + TAIL, local_addr=("127.0.0.3", 0), **auth)
        return wrong, right_here, right_elsewhere

    wrong, (here, here_code), (elsewhere, elsewhere_code) = asyncio.run(main())
    assert [codes(r)[0] for r, _ in wrong] == ["unauthorized"] * 3 + ["too_many_auth_failures"] * 2
    assert codes(here) == ["too_many_auth_failures"] and here_code == 1008   # even with the right key
    assert elsewhere_code == 1000 and elsewhere[-1]["type"] == "end"
    assert srv.metric("simulserve_refusals_total", reason="ip_auth_failures") == 3


def test_failed_keys_per_address_are_limited(trained):
    with LiveServer(models={"waitk": str(trained["waitk"])}, api_keys=[KEY], max_auth_failures_per_ip=3,
                    auth_failure_window_s=60) as srv:
        failed_keys_per_address_are_limited(srv)


# ---------------------------------------------------------------- 8. the smaller items
def test_long_words_and_an_empty_model_name_are_refused(server, reference):
    long = "x" * 201
    cases = {
        "words": ([START, {"type": "words", "words": [long]}] + TAIL, "bad_message"),
        "text": ([START, {"type": "text", "text": long + " "}] + TAIL, "bad_message"),
        "text_cut": ([START, {"type": "text", "text": long}] + TAIL, "bad_message"),
        "empty_model": ([{"type": "start", "model": ""}, START] + TAIL, "unknown_model"),
    }

    async def main():
        return await asyncio.gather(*(talk(server.url, msgs) for msgs, _ in cases.values()))

    for (name, (_, code)), (received, close_code) in zip(cases.items(), asyncio.run(main())):
        assert codes(received) == [code], name
        assert close_code == 1000 and translated(received) == [reference("waitk", {"k": 2}, "haus baum").prediction]


def test_head_requests_on_the_probes(server):
    for path in ("/health", "/v1/models", "/metrics"):
        r = httpx.head(server.http + path)
        assert r.status_code == 200 and r.content == b"", path


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


def test_invalid_utf8_closes_with_1007_and_one_quiet_log_line(server, reference):
    handler = _Records()
    loggers = [logging.getLogger(n) for n in ("uvicorn.error", "simulserve.server")]
    for lg in loggers:
        lg.addHandler(handler)

    async def main():
        async with connect(server.url) as ws:
            await ws.send(json.dumps(START))
            await ws.recv()
            await ws.send(b'{"type": "text", "text": "\xff\xfe"}', text=True)
            return await closed(ws)

    try:
        code = asyncio.run(main())
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
    assert code == 1007
    assert not [r for r in handler.records if r.levelno >= logging.ERROR or r.exc_info]
    assert any("not UTF-8" in r.getMessage() for r in handler.records)


def test_pings_count_against_the_rate_limit(trained):
    with LiveServer(models={"waitk": str(trained["waitk"])}, rate_limit=5, rate_burst=10) as srv:
        async def main():
            async with connect(srv.url) as ws:
                await ws.send(json.dumps(START))
                await ws.recv()
                try:
                    for _ in range(40):
                        await ws.ping()
                        await asyncio.sleep(0.001)
                except ConnectionClosed:
                    pass
                return await closed(ws)

        assert asyncio.run(main()) == 1008
        assert srv.metric("simulserve_refusals_total", reason="ping_flood") == 1


def test_cache_pool_shrinks_and_keeps_live_slots(word_tok):
    from conftest import tiny_config
    pool = CachePool(tiny_config(word_tok, "gma"))
    slots = [pool.allocate() for _ in range(40)]
    assert pool.capacity == 64 and slots == list(range(40))       # the lowest free slot first
    for name, t in pool.tensors.items():
        t[:, 3] = 3.0
    for s in slots:
        if s != 3:
            pool.release(s)
    assert pool.shrink() == 0                   # 40 were in use since the last call: keep them
    assert pool.shrink() == 60 and pool.capacity == 4
    assert all(float(t[:, 3].min()) == 3.0 for t in pool.tensors.values() if t.numel())
    assert [pool.allocate() for _ in range(3)] == [0, 1, 2] and pool.allocate() == 4
    with pytest.raises(ValueError):
        pool.release(3 + 64)


def test_the_server_gives_idle_cache_slots_back(trained):
    with LiveServer(models={"gma": str(trained["gma"])}, memory_trim_s=0.3) as srv:
        async def main():
            socks = []
            for _ in range(20):
                ws = await connect(srv.url)
                await ws.send(json.dumps({"type": "start"}))
                await ws.send(json.dumps({"type": "words", "words": ["haus", "baum"]}))
                await ws.recv()
                socks.append(ws)
            assert srv.wait_metric("simulserve_cache_slots_in_use", 20, model="gma") == 20
            grown = srv.metric("simulserve_cache_slots_allocated", model="gma")
            for ws in socks:
                await ws.close()
            return grown

        assert asyncio.run(main()) >= 20     # the slots handed out (a reserved pool commits no more)
        assert srv.wait_metric("simulserve_cache_slots_allocated", 4, model="gma") == 4
