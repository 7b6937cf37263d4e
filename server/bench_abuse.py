"""`simulserve bench abuse`: a fixed, bounded mix of attacks while honest streams run (figures printed).

    simulserve bench abuse                               # shipped waitk model, ~2 minutes
    simulserve bench abuse --checkpoint gma_delta1 --settle 60 --soak-streams 100

It starts its own server (the real `simulserve serve`, on a loopback port, with an API key) and:
1. reference: the honest streams alone (from 127.0.0.2), each sentence's words recorded;
2. attack: the same honest streams again while attackers (from 127.0.0.3-5) send, in a fixed
   order and number: junk without reading, lone surrogates, wrong keys, oversized and numerous
   headers, connections that never `start`, junk keep-alives, silent and trickling TCP sockets,
   bad UTF-8, ping floods, long words, `model: ""`, binary and oversized frames; `/health` is
   polled throughout;
3. settle: the attack stops; after --settle seconds the server's resident memory is read again;
4. cache soak: --soak-streams streams each hold a cache slot, then leave; resident memory and
   allocated slots at the peak and after two memory-trim periods.

Printed: honest sentences completed and identical to the reference, words lost/duplicated,
`seq` gaps, `/health` failures, RSS growth, every error code / close code / HTTP status the
attackers saw, the server's refusal counters. Exit status 1 if an honest word was lost or changed or
`/health` failed.
"""
from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from server.bench import FALLBACK, free_port, load_sentences, scrape, wait_healthy

KEY = "abuse-bench-key"
HUGE_HEAD = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000_000 + b"\r\n\r\n"
HONEST, ATTACK, AUTH_ATTACK, FLOOD = "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"


def add_abuse_bench_args(p) -> None:
    p.add_argument("--checkpoint", default="waitk", help="checkpoint dir or shipped name (default waitk)")
    p.add_argument("--honest", type=int, default=3, help="honest streams (default 3)")
    p.add_argument("--sentences", type=int, default=6, help="sentences per honest stream (default 6)")
    p.add_argument("--gap", type=float, default=0.04, help="seconds between an honest stream's words")
    p.add_argument("--rounds", type=int, default=2, help="times the attack mix is repeated (default 2)")
    p.add_argument("--settle", type=float, default=60.0, help="seconds after the attack before RSS is read")
    p.add_argument("--soak-streams", type=int, default=100, help="streams of the cache soak (0: skip it)")
    p.add_argument("--memory-trim-s", type=float, default=5.0, help="the server's memory-trim period")
    p.add_argument("--server-threads", type=int, default=1, help="torch threads of the server")
    p.add_argument("--input", help="source sentences, one per line (default data/de-en/test.de)")
    p.add_argument("--max-words", type=int, default=20, help="skip longer source sentences")
    p.add_argument("--json", help="also write the figures here")


# ---------------------------------------------------------------- honest streams
async def honest_stream(url: str, sentences: list[list[str]], gap: float) -> dict:
    """Word by word with a pause; every server message kept."""
    from websockets.asyncio.client import connect
    got: list[dict] = []
    async with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, local_addr=(HONEST, 0),
                       max_size=2 ** 22, open_timeout=60) as ws:
        await ws.send(json.dumps({"type": "start"}))

        async def reader():
            async for raw in ws:
                got.append(json.loads(raw))
                if got[-1]["type"] == "end":
                    return

        task = asyncio.create_task(reader())
        for words in sentences:
            for w in words:
                await ws.send(json.dumps({"type": "words", "words": [w]}))
                await asyncio.sleep(gap)
            await ws.send('{"type": "end_sentence"}')
        await ws.send('{"type": "end_stream"}')
        await asyncio.wait_for(task, 600)
    return {"messages": got, "close": ws.close_code}


async def honest_run(url, plans, gap) -> list[dict]:
    return await asyncio.gather(*(honest_stream(url, p, gap) for p in plans))


async def honest_throughout(url, plans, gap, attack_done: asyncio.Event) -> list[dict]:
    """The same honest streams again and again until the attack is over (each run is compared)."""
    runs = []
    while not attack_done.is_set():
        runs += await honest_run(url, plans, gap)
    return runs


def compare(reference: list[dict], attacked: list[dict]) -> dict:
    """Sentence by sentence, word by word: identical, lost, duplicated; seq gaps; errors."""
    out = Counter()
    for ref, got in zip(reference * (len(attacked) // len(reference)), attacked):
        ref_s = [m for m in ref["messages"] if m["type"] == "sentence"]
        got_s = [m for m in got["messages"] if m["type"] == "sentence"]
        out["sentences"] += len(ref_s)
        out["completed"] += len(got_s)
        for a, b in zip(ref_s, got_s):
            out["identical"] += a["translation"] == b["translation"] and a["delays"] == b["delays"]
        ref_w = Counter((m["sentence"], m["index"], m["text"]) for m in ref["messages"] if m["type"] == "word")
        got_w = Counter((m["sentence"], m["index"], m["text"]) for m in got["messages"] if m["type"] == "word")
        out["words"] += sum(ref_w.values())
        out["lost"] += sum((ref_w - got_w).values())
        out["duplicated"] += sum((got_w - ref_w).values())
        seqs = [m["seq"] for m in got["messages"] if m["type"] == "word"]
        out["seq_gaps"] += seqs != list(range(len(seqs)))
        out["honest_errors"] += sum(m["type"] == "error" for m in got["messages"])
        out["unclean_close"] += got["close"] != 1000
    return dict(out)


# ---------------------------------------------------------------- attacks
class Seen:
    """Everything the attackers got back: error codes, close codes, HTTP statuses, how connections ended."""

    def __init__(self):
        self.c = Counter()

    def add(self, kind: str, value) -> None:
        self.c[f"{kind} {value}"] += 1


async def _tcp(port: int, addr: str, rcvbuf: int | None = None):
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind((addr, 0))
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock, limit=2 ** 16)


async def _read_all(reader, timeout: float) -> bytes:
    out = b""
    try:
        async with asyncio.timeout(timeout):
            while chunk := await reader.read(65536):
                out += chunk
    except (TimeoutError, ConnectionError):
        pass
    return out


async def http_raw(port, seen: Seen, name: str, data: bytes, trickle: float = 0.0, timeout: float = 30) -> None:
    try:
        reader, writer = await _tcp(port, ATTACK)
    except OSError as e:
        return seen.add(name, f"connect failed ({type(e).__name__})")
    t0 = time.monotonic()
    replied = asyncio.create_task(_read_all(reader, timeout))   # the server may answer before we finish
    try:
        if trickle:
            for i in range(len(data)):
                if replied.done():
                    break
                writer.write(data[i:i + 1])
                await writer.drain()
                await asyncio.sleep(trickle)
        else:
            for i in range(0, len(data), 2 ** 20):
                if replied.done():
                    break
                writer.write(data[i:i + 2 ** 20])
                await writer.drain()
    except (ConnectionError, OSError):
        pass
    reply = await replied
    status = reply.split(b" ", 2)[1].decode() if reply.startswith(b"HTTP/") else "closed, no reply"
    seen.add(name, f"HTTP {status}" + (f" after {time.monotonic() - t0:.0f} s" if name.startswith("silent")
                                        or name.startswith("trickle") else ""))
    writer.close()


async def ws_attack(url, seen: Seen, name: str, frames: list, *, addr=ATTACK, key=KEY, read=True,
                    ping_flood: int = 0, junk_for: float = 0.0, timeout: float = 30, subprotocols=None) -> None:
    """Send `frames` (dict -> JSON, str -> text, bytes -> binary, ("text", bytes) -> raw text frame)."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed, InvalidStatus
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        ws = await connect(url, additional_headers=headers, local_addr=(addr, 0), open_timeout=30,
                           ping_interval=None, subprotocols=subprotocols)
    except InvalidStatus as e:
        return seen.add(name, f"HTTP {e.response.status_code}")
    except (OSError, TimeoutError) as e:
        return seen.add(name, f"connect failed ({type(e).__name__})")
    try:
        for f in frames:
            if isinstance(f, tuple):
                await ws.send(f[1], text=True)
            else:
                await ws.send(json.dumps(f) if isinstance(f, dict) else f)
        for _ in range(ping_flood):
            await ws.ping()
        t0 = time.monotonic()
        while time.monotonic() - t0 < junk_for:     # junk to keep the connection alive (it must not)
            await ws.send("junk")
            await asyncio.sleep(1)
    except ConnectionClosed:
        pass
    try:   # what the server said, also when it closed while we were still sending
        async with asyncio.timeout(timeout):
            async for raw in ws:
                m = json.loads(raw)
                if m["type"] == "error":
                    seen.add(name, m["code"])
    except (ConnectionClosed, TimeoutError):
        pass
    seen.add(name, f"close {ws.close_code}")
    await ws.close()


async def non_reader(port, seen: Seen, frames: int = 900, rate: float = 90.0) -> None:
    """Junk under the rate limit (90/s), reading nothing after the handshake (sans-I/O client, tiny
    buffers): the replies must neither pile up in the server nor keep the connection alive."""
    from websockets.client import ClientProtocol
    from websockets.uri import parse_uri
    reader, writer = await _tcp(port, ATTACK, rcvbuf=4096)
    writer.transport.set_write_buffer_limits(high=2 ** 16)
    proto = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/v1/stream"))
    req = proto.connect()
    req.headers["Authorization"] = f"Bearer {KEY}"
    proto.send_request(req)
    writer.write(b"".join(proto.data_to_send()))
    while not proto.events_received():
        proto.receive_data(await reader.read(4096))
    writer.transport.pause_reading()            # from now on nothing is read
    junk = json.dumps({"type": "bogus", "id": "i" * 100, "pad": "p" * 3000}).encode()
    t0 = time.monotonic()
    try:
        for i in range(frames):
            proto.send_text(json.dumps({"type": "start"}).encode() if i == 0 else junk)
            writer.write(b"".join(proto.data_to_send()))
            await asyncio.wait_for(writer.drain(), 20)
            await asyncio.sleep(max(0.0, t0 + (i + 1) / rate - time.monotonic()))
    except (ConnectionError, OSError, TimeoutError):
        pass
    # the server drops us (slow_consumer) once its queue of unsent replies is full: our writes then fail
    dropped = writer.transport.is_closing()
    while not dropped and time.monotonic() - t0 < 40:
        try:
            proto.send_ping(b"")
            writer.write(b"".join(proto.data_to_send()))
            await asyncio.wait_for(writer.drain(), 1)
            await asyncio.sleep(0.5)
        except TimeoutError:
            pass
        except Exception:  # noqa: BLE001 - reset, closed, or the protocol saw the close
            dropped = True
        dropped = dropped or writer.transport.is_closing()
    seen.add("non-reader", "dropped by the server" if dropped else "still open after 40 s")
    writer.transport.abort()


def _attacks(url: str, port: int, seen: Seen) -> list:
    start = {"type": "start"}
    long_word = "x" * 300
    key_proto = "simulserve.key." + base64.urlsafe_b64encode(b"wrong").decode().rstrip("=")
    ws_upgrade = ("GET /v1/stream HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n")
    surrogates = ['{"type": "bogus", "id": "\\ud800"}', '{"type": "start", "id": "\\udfff"}',
                  '{"type": "words", "words": ["a\\ud800"]}', '{"type": "text", "text": "\\ud800 "}',
                  '{"type": "words", "words": ["haus"], "\\ud800": 1}']
    a = []
    a += [non_reader(port, seen) for _ in range(3)]
    a += [ws_attack(url, seen, "surrogates", [start, {"type": "words", "words": ["haus"]}] + surrogates * 20
                    + [{"type": "end_stream"}]) for _ in range(3)]
    a += [ws_attack(url + f"?token=wrong{i}", seen, "wrong key", [start], addr=AUTH_ATTACK, key=None)
          for i in range(30)]
    a += [ws_attack(url, seen, "wrong subprotocol key", [start], addr=AUTH_ATTACK, key=None,
                    subprotocols=["simulserve.v1", key_proto])]
    a += [http_raw(port, seen, "100 MB header", HUGE_HEAD) for _ in range(2)]
    a += [http_raw(port, seen, "1 MB websocket cookie", (ws_upgrade + "Cookie: " + "c" * 1_000_000
                                                         + "\r\n\r\n").encode()) for _ in range(3)]
    a += [http_raw(port, seen, "500 headers", b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
                   + b"".join(b"X-%d: 1\r\n" % i for i in range(500)) + b"\r\n") for _ in range(3)]
    a += [ws_attack(url, seen, "never starts", [], addr=FLOOD) for _ in range(80)]   # > per-IP limit
    a += [ws_attack(url, seen, "junk keep-alive", [start], junk_for=12) for _ in range(4)]
    a += [http_raw(port, seen, "silent TCP", b"") for _ in range(40)]
    a += [http_raw(port, seen, "trickled head", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 200,
                   trickle=0.1) for _ in range(5)]
    a += [ws_attack(url, seen, "bad UTF-8", [start, ("text", b'{"type": "text", "text": "\xff\xfe"}')])
          for _ in range(10)]
    a += [ws_attack(url, seen, "ping flood", [start], ping_flood=400) for _ in range(3)]
    a += [ws_attack(url, seen, "long words / empty model",
                    [{"type": "start", "model": ""}, start, {"type": "words", "words": [long_word]},
                     {"type": "text", "text": long_word + " "}, {"type": "end_stream"}]) for _ in range(5)]
    a += [ws_attack(url, seen, "binary / oversized frames", [start, b"\x00\x01" * 100, "x" * 20000,
                                                               {"type": "end_stream"}]) for _ in range(5)]
    a += [ws_attack(url, seen, "message flood", [start] + ['{"type": "end_sentence"}'] * 800) for _ in range(3)]
    return a


def health_poller(base: str, stop: threading.Event, stats: Counter) -> None:
    """In its own thread (and connection): /health every 0.2 s; a failure is an error or not 200 in 5 s."""
    import httpx
    with httpx.Client(timeout=5) as client:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                ok = client.get(base + "/health").status_code == 200
            except httpx.HTTPError:
                ok = False
            stats["polls"] += 1
            stats["failures"] += not ok
            stats["slowest_ms"] = max(stats["slowest_ms"], round((time.monotonic() - t0) * 1000))
            stop.wait(0.2)


# ---------------------------------------------------------------- the command
def _rss_mb(base: str) -> float:
    return scrape(base).get("process_resident_memory_bytes", 0) / 2 ** 20


def _start_server(args) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cmd = [sys.executable, "-m", "clients.cli", "serve", f"bench={args.checkpoint}", "--host", "127.0.0.1",
           "--port", str(port), "--api-key", KEY, "--log-level", "warning", "--torch-threads",
           str(args.server_threads), "--memory-trim-s", str(args.memory_trim_s), "--max-streams", "256",
           "--max-connections-per-ip", "64", "--max-auth-failures-per-ip", "20", "--rate-limit", "100",
           "--rate-burst", "200", "--max-output-messages", "2000",
           "--idle-timeout", "5"]
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen(cmd, cwd=root, env=env, stderr=subprocess.DEVNULL), port


def run_abuse_bench(args) -> int:
    proc, port = _start_server(args)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc)
        return asyncio.run(_main(args, port))
    finally:
        proc.terminate()
        proc.wait(30)


async def _main(args, port: int) -> int:
    base, url = f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}/v1/stream"
    lines = load_sentences(args) if args.input or Path("data/de-en/test.de").is_file() \
        else [s.split() for s in FALLBACK]
    plans = [[lines[(i * args.sentences + j) % len(lines)] for j in range(args.sentences)]
             for i in range(args.honest)]
    print(f"abuse bench: {args.checkpoint}, {args.honest} honest streams x {args.sentences} sentences", flush=True)
    reference = await honest_run(url, plans, args.gap)
    rss_before = _rss_mb(base)
    print(f"reference run done; server RSS {rss_before:.0f} MB", flush=True)

    seen, health, stop = Seen(), Counter(), threading.Event()
    poller = threading.Thread(target=health_poller, args=(base, stop, health), daemon=True)
    poller.start()
    t0 = time.monotonic()
    attack_done = asyncio.Event()
    honest = asyncio.create_task(honest_throughout(url, plans, args.gap, attack_done))
    rss_peak = rss_before
    for r in range(args.rounds):
        attacks = asyncio.gather(*_attacks(url, port, seen))
        while not attacks.done():
            await asyncio.sleep(1)
            rss_peak = max(rss_peak, _rss_mb(base))
        await attacks
        print(f"attack round {r + 1}/{args.rounds} done ({time.monotonic() - t0:.0f} s)", flush=True)
    attack_done.set()
    attacked = await honest
    attack_s = time.monotonic() - t0
    rss_end = _rss_mb(base)
    print(f"attack done in {attack_s:.0f} s; settling {args.settle:g} s", flush=True)
    await asyncio.sleep(args.settle)
    rss_settled = _rss_mb(base)
    stop.set()
    poller.join(10)
    result = compare(reference, attacked)
    if args.json:   # the raw streams, for a look at any difference
        with open(args.json + ".streams", "w") as f:
            json.dump({"reference": reference, "attacked": attacked}, f)
    metrics = scrape(base)
    refusals = {k.split('"')[1]: int(v) for k, v in metrics.items() if k.startswith("simulserve_refusals_total{")}
    errors = {k.split('"')[1]: int(v) for k, v in metrics.items() if k.startswith("simulserve_errors_total{")}

    soak = await cache_soak(args, url, base) if args.soak_streams else None
    growth = (rss_settled - rss_before) / rss_before * 100
    out = {"honest": result, "health": dict(health), "attack_seconds": round(attack_s, 1),
           "rss_mb": {"before": round(rss_before), "peak": round(rss_peak), "attack_end": round(rss_end),
                      "settled": round(rss_settled), "growth_percent": round(growth, 1)},
           "attackers_saw": dict(sorted(seen.c.items())), "server_refusals": refusals, "server_errors": errors,
           "cache_soak": soak}
    print(f"\nhonest streams during the attack: {len(attacked)} ({len(attacked) // len(plans)} runs of "
          f"{len(plans)}); sentences completed {result['completed']}/{result['sentences']}, identical to the "
          f"unattacked run {result['identical']}/{result['sentences']}")
    print(f"honest words {result['words']}: lost {result['lost']}, duplicated {result['duplicated']}; "
          f"streams with seq gaps {result['seq_gaps']}; errors to honest streams {result['honest_errors']}; "
          f"unclean closes {result['unclean_close']}")
    print(f"/health: {health['polls']} polls, {health['failures']} failures, slowest {health['slowest_ms']} ms")
    print(f"server RSS: {rss_before:.0f} MB before the attack, {rss_peak:.0f} MB peak, {rss_end:.0f} MB when it "
          f"stopped, {rss_settled:.0f} MB after {args.settle:g} s: {growth:+.1f} %")
    print("\nwhat the attackers saw:")
    for k, v in sorted(seen.c.items()):
        print(f"  {k}: {v}")
    print("server refusals (simulserve_refusals_total): " + ", ".join(f"{k} {v}" for k, v in sorted(refusals.items())))
    print("server errors (simulserve_errors_total): " + ", ".join(f"{k} {v}" for k, v in sorted(errors.items())))
    if soak:
        print(f"\ncache soak: {soak['streams']} streams holding a cache slot: RSS {soak['rss_idle_mb']} MB idle, "
              f"{soak['rss_peak_mb']} MB with them ({soak['slots_peak']} slots allocated), {soak['rss_after_mb']} MB "
              f"{soak['after_s']:g} s after they left ({soak['slots_after']} slots allocated)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    ok = result["lost"] == 0 and result["duplicated"] == 0 and result["seq_gaps"] == 0 \
        and result["identical"] == result["sentences"] and health["failures"] == 0
    return 0 if ok else 1


async def cache_soak(args, url, base) -> dict:
    """Many streams each holding a cache slot (a sentence in progress), then gone."""
    from websockets.asyncio.client import connect
    idle = _rss_mb(base)
    socks = []
    for i in range(args.soak_streams):
        ws = await connect(url, additional_headers={"Authorization": f"Bearer {KEY}"},
                           local_addr=(f"127.0.1.{1 + i // 50}", 0))
        await ws.send(json.dumps({"type": "start"}))
        await ws.send(json.dumps({"type": "words", "words": ["Das", "ist"]}))
        await ws.recv()
        socks.append(ws)
    await asyncio.sleep(2)
    m = scrape(base)
    slots = 'simulserve_cache_slots_allocated{model="bench"}'
    peak, slots_peak = m["process_resident_memory_bytes"] / 2 ** 20, m.get(slots)
    for ws in socks:
        await ws.close()
    after_s = 2 * args.memory_trim_s + 2
    await asyncio.sleep(after_s)
    m = scrape(base)
    return {"streams": args.soak_streams, "rss_idle_mb": round(idle), "rss_peak_mb": round(peak),
            "slots_peak": int(slots_peak or 0), "rss_after_mb": round(m["process_resident_memory_bytes"] / 2 ** 20),
            "slots_after": int(m.get(slots, 0)), "after_s": after_s}
