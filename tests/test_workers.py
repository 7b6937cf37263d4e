"""`simulserve serve --workers 2`: one engine process and two front-end processes behave as one process does.

The important tests of test_server.py, test_server_limits.py and test_hardening.py run unchanged against a real
`simulserve serve --workers 2` started as a subprocess (each class below starts one with its module's
settings); the tests after them cover what only several processes have: limits that hold across front ends,
a process that dies, shutdown, the merged /metrics.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import pytest
from websockets.asyncio.client import connect

import test_admission as admission
import test_hardening as hardening
import test_server as single
import test_server_limits as limits
from conftest import ROOT
from test_server import LiveServer, codes, make_reference, talk
from test_server_limits import START, TAIL

WORKERS = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env_value(v) -> str:
    return json.dumps(v) if isinstance(v, (dict, list, bool)) else str(v)


class WorkersServer(LiveServer):
    """`simulserve serve --workers N` in a subprocess on a free loopback port, its settings given as SIMULSERVE_*
    variables (LiveServer's defaults: float32 steps, no admission by headroom); LiveServer's interface."""

    def __init__(self, workers: int = WORKERS, engines: int = 1, log_level: str = "warning", **settings):
        settings.setdefault("step", "default")
        settings.setdefault("admission", False)
        self.engines = engines
        self.port = free_port()
        self.http = f"http://127.0.0.1:{self.port}"
        self.url = f"ws://127.0.0.1:{self.port}/v1/stream"
        self.env = {**{k: v for k, v in os.environ.items()
                       if not k.startswith("SIMULSERVE_") or k == "SIMULSERVE_CACHE_DIR"},
                    "PYTHONPATH": str(ROOT),
                    **{f"SIMULSERVE_{k.upper()}": _env_value(v) for k, v in settings.items()}}
        self.cmd = [sys.executable, "-m", "clients.cli", "serve", "--workers", str(workers), "--engines", str(engines),
                    "--port", str(self.port),
                    "--torch-threads", "1", "--log-level", log_level]

    def __enter__(self):
        return self.start()

    def start(self):
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
                                     text=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if httpx.get(self.http + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            self.proc.kill()
            raise RuntimeError(f"the server did not become healthy:\n{self.output()}")
        m = re.search(r"engine process(?:es)? pid ([\d, ]+), front ends pid ([\d, ]+)", self.output())
        self.engine_pids, self.front_pids = ([int(p) for p in m.group(i).split(",")] for i in (1, 2))
        self.engine_pid = self.engine_pids[0]   # (the primary)
        return self

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise

    def __exit__(self, *exc):
        code = self.stop()
        out = self.output()
        self.log.close()
        assert code == 0 and "Traceback" not in out, out

    def pids(self) -> list[int]:
        return self.engine_pids + self.front_pids


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not open(f"/proc/{pid}/stat").read().split(") ")[1].startswith("Z")


@pytest.fixture(scope="module")
def reference(trained):
    return make_reference(trained)


# ---------------------------------------------------------------- the existing tests, against --workers 2
class TestServer:
    """test_server.py: output equals `simulserve translate` per policy, 50 concurrent streams, bad input."""
    engines = 1   # (test_engines.py runs the same with 2)

    @pytest.fixture(scope="class")
    @classmethod
    def server(cls, trained):
        with WorkersServer(engines=cls.engines, models={p: str(path) for p, path in trained.items()},
                           rate_limit=10000, rate_burst=10000) as srv:
            yield srv

    test_http_endpoints = staticmethod(single.test_http_endpoints)
    test_stream_equals_translate = staticmethod(single.test_stream_equals_translate)
    test_fifty_concurrent_streams = staticmethod(single.test_fifty_concurrent_streams)
    test_bad_input_gets_codes_and_other_streams_carry_on = staticmethod(
        single.test_bad_input_gets_codes_and_other_streams_carry_on)
    test_disconnect_mid_sentence_frees_the_stream = staticmethod(single.test_disconnect_mid_sentence_frees_the_stream)


class TestLimits:
    """test_server_limits.py: keys, origins, server_full, idle timeout, floods, backlog, sizes."""

    @pytest.fixture(scope="class")
    @classmethod
    def server(cls, trained):
        with WorkersServer(models={"waitk": str(trained["waitk"])}, api_keys=[limits.KEY], max_streams=8,
                           allowed_origins=["http://good.example"], idle_timeout_s=2.0, rate_limit=20, rate_burst=20,
                           max_message_bytes=512, max_backlog_words=8, max_words_per_sentence=6) as srv:
            srv.auth = {"additional_headers": {"Authorization": f"Bearer {limits.KEY}"}}
            yield srv

    test_api_key_paths = staticmethod(limits.test_api_key_paths)
    test_allowed_origins = staticmethod(limits.test_allowed_origins)
    test_server_full_then_a_slot_frees = staticmethod(limits.test_server_full_then_a_slot_frees)
    test_idle_timeout = staticmethod(limits.test_idle_timeout)
    test_idle_timeout_mid_sentence_translates_the_open_sentence_first = staticmethod(
        limits.test_idle_timeout_mid_sentence_translates_the_open_sentence_first)
    test_auto_segment_cuts_a_sentence_with_no_end_instead_of_refusing_its_words = staticmethod(
        limits.test_auto_segment_cuts_a_sentence_with_no_end_instead_of_refusing_its_words)
    test_flood_backlog_and_sizes_while_a_good_stream_carries_on = staticmethod(
        limits.test_flood_backlog_and_sizes_while_a_good_stream_carries_on)
    test_a_pause_ends_the_open_sentence_and_the_stream_goes_on = staticmethod(
        limits.test_a_pause_ends_the_open_sentence_and_the_stream_goes_on)


class TestHardening:
    """test_hardening.py: echoes, surrogates, request heads, slots without `start`, connections per address."""

    @pytest.fixture(scope="class")
    @classmethod
    def server(cls, trained):
        with WorkersServer(models={"waitk": str(trained["waitk"])}, max_streams=6, start_timeout_s=1.0,
                           idle_timeout_s=1.5, max_output_messages=50, rate_limit=5000, rate_burst=5000,
                           max_connections_per_ip=4, request_head_timeout_s=1.0, max_header_bytes=8192,
                           max_headers=50) as srv:
            yield srv

    test_long_ids_and_values_are_not_echoed_in_full = staticmethod(
        hardening.test_long_ids_and_values_are_not_echoed_in_full)
    test_a_lone_surrogate_anywhere_is_a_bad_message_and_the_stream_goes_on = staticmethod(
        hardening.test_a_lone_surrogate_anywhere_is_a_bad_message_and_the_stream_goes_on)
    test_oversized_and_numerous_headers_get_431_and_health_stays_fast = staticmethod(
        hardening.test_oversized_and_numerous_headers_get_431_and_health_stays_fast)
    test_silent_and_trickling_connections_are_closed = staticmethod(
        hardening.test_silent_and_trickling_connections_are_closed)
    test_connections_without_start_or_with_only_junk_do_not_hold_slots = staticmethod(
        hardening.test_connections_without_start_or_with_only_junk_do_not_hold_slots)
    test_connections_per_address_are_limited_and_other_addresses_get_in = staticmethod(
        hardening.test_connections_per_address_are_limited_and_other_addresses_get_in)
    test_long_words_and_an_empty_model_name_are_refused = staticmethod(
        hardening.test_long_words_and_an_empty_model_name_are_refused)
    test_head_requests_on_the_probes = staticmethod(hardening.test_head_requests_on_the_probes)

    def test_the_address_limit_holds_across_front_ends(self, server):
        """max_connections_per_ip=4 with the 4 connections spread over both front ends: the 5th is refused."""
        async def main():
            for _ in range(20):      # the kernel picks the front end: until both hold some
                held = [await connect(server.url) for _ in range(4)]
                per_front = [held_by(pid, server.port) for pid in server.front_pids]
                if all(per_front):
                    break
                for ws in held:
                    await ws.close()
            extra = await talk(server.url, [START] + TAIL)
            for ws in held:
                await ws.close()
            return per_front, extra

        per_front, (extra, code) = asyncio.run(main())
        assert all(per_front) and sum(per_front) == 4, per_front
        assert codes(extra) == ["too_many_connections"] and code == 1013


class TestAdmission:
    """test_admission.py: a flood; the engine process refuses with server_busy, every client gets in on retry
    and writes what it writes alone; /health stays up."""

    engines = 1

    @pytest.fixture(scope="class")
    @classmethod
    def flood_server(cls, trained):
        with WorkersServer(engines=cls.engines, models={"gma": str(trained["gma"])}, admission=True, delay_budget_ms=2,
                           admission_retry_max_s=0.5, max_connections_per_ip=0, memory_trim_s=0.5) as srv:
            yield srv

    test_flood_admitted_streams_complete_unchanged_refused_get_server_busy = staticmethod(
        admission.test_flood_admitted_streams_complete_unchanged_refused_get_server_busy)


def held_by(pid: int, port: int) -> int:
    """Established TCP connections to `port` whose socket process `pid` holds (from /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    n = 0
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        f = line.split()
        if int(f[1].split(":")[1], 16) == port and f[3] == "01" and f[9] in inodes:
            n += 1
    return n


# ---------------------------------------------------------------- what only several processes have
def test_a_client_waiting_for_its_translation_is_not_idle(trained):
    """The idle test asks the engine process whether it still owes the stream words."""
    words = [f"w{i % 7}" for i in range(30)]
    msgs = [{"type": "start", "model": "waitk", "k": 1}]
    for _ in range(12):
        msgs += [{"type": "words", "words": words}, {"type": "end_sentence"}]
    with WorkersServer(models={"waitk": str(trained["waitk"])}, idle_timeout_s=0.3, max_backlog_words=512,
                       max_words_per_sentence=40, max_batch=1) as srv:
        received, code = asyncio.run(talk(srv.url, msgs + [{"type": "end_stream"}]))
    assert not codes(received) and code == 1000
    assert len([m for m in received if m["type"] == "sentence"]) == 12


def test_failed_keys_and_connections_per_address_count_across_front_ends(trained):
    """Failed keys from one address are counted by the engine process, whichever front end saw them."""
    key = "workers-key"
    with WorkersServer(models={"waitk": str(trained["waitk"])}, api_keys=[key], max_auth_failures_per_ip=3,
                       auth_failure_window_s=60) as srv:
        hardening.failed_keys_per_address_are_limited(srv, key)
        assert srv.metric("simulserve_errors_total", code="unauthorized") == 3   # counted by the front ends


def test_one_scrape_shows_the_whole_server(trained):
    """Each family once; the engine process's and every front end's series summed."""
    with WorkersServer(models={"waitk": str(trained["waitk"])}) as srv:
        asyncio.run(talk(srv.url, [START] + TAIL))
        asyncio.run(talk(srv.url, ["not json", START] + TAIL))
        text = httpx.get(srv.http + "/metrics").text
        types = re.findall(r"^# TYPE (\S+)", text, re.M)
        assert len(types) == len(set(types))
        assert srv.metric("simulserve_models_loaded") == 1
        assert srv.metric("simulserve_target_words_total", model="waitk") >= 2      # engine process
        assert srv.metric("simulserve_errors_total", code="bad_json") == 1          # a front end
        rss = srv.metric("process_resident_memory_bytes")
        own = [int(open(f"/proc/{pid}/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
               for pid in [srv.engine_pid] + srv.front_pids]
        assert rss > max(own)     # the sum over the three processes
        assert httpx.get(srv.http + "/health").json()["active_streams"] == 0


@pytest.mark.parametrize("victim, engines", [("engine", 1), ("front end", 1), ("engine 2", 2)])
def test_a_process_that_dies_stops_the_server(trained, victim, engines):
    """Any one process killed (with --engines 2: the second engine process) stops the whole server with its line."""
    srv = WorkersServer(engines=engines, models={"waitk": str(trained["waitk"])}).start()
    try:
        assert len(srv.engine_pids) == engines
        pid = srv.engine_pids[-1] if victim.startswith("engine") else srv.front_pids[0]
        os.kill(pid, signal.SIGKILL)
        code = srv.proc.wait(30)
        out = srv.output()
    finally:
        srv.stop()
    assert code == 1, out
    assert re.search(rf"the {victim}( \d)? process \(pid {pid}\) exited with code -9: stopping the server", out), out
    assert not any(alive(p) for p in srv.pids())


def test_sigterm_closes_open_streams_and_stops_cleanly(trained):
    from test_share import Viewer
    srv = WorkersServer(models={"waitk": str(trained["waitk"])}, log_level="info")
    with srv:
        done, _ = asyncio.run(talk(srv.url, [START, {"type": "words", "words": ["haus", "baum"]},
                                             {"type": "end_stream"}]))

        async def main():
            ws = await connect(srv.url)
            await ws.send(json.dumps({**START, "share": True}))
            ready = json.loads(await ws.recv())
            assert ready["type"] == "ready"
            viewers.append(Viewer(srv.http, ready["share"]["watch"]).started())   # (its response never ends)
            srv.proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(20):
                    async for _ in ws:
                        pass
            except Exception:  # noqa: BLE001
                pass
            return ws.close_code, ready["stream"]

        viewers = []
        code, stream = asyncio.run(main())
        assert code == 1012          # uvicorn's "service restart"
        assert srv.proc.wait(30) == 0
        viewers[0].join(5)
        assert viewers[0].status == 200 and not viewers[0].is_alive()
        output = srv.output()
    assert not any(alive(p) for p in srv.pids())
    # each front end logs its streams (server/stream_log.py): the finished one, and the one the stop closed
    logged = re.findall(r"\[front end \d\] simulserve\.streams: (.*)", output)
    finished = [line for line in logged if line.startswith(f"stream {done[0]['stream']} ")][0]
    assert "2 word(s) in, 2 out (lag mean " in finished and finished.endswith("ended by the client (end_stream)")
    assert [line for line in logged if line.startswith(f"stream {stream} ")][0].endswith(
        "server stopping (close code 1012, restarting)")


def test_workers_setting(monkeypatch):
    from server.settings import SettingsError, front_end_processes, load_settings
    auto = load_settings()
    assert auto.workers == 0   # auto: chosen by the device
    assert front_end_processes(auto, "cpu", 16) == 1
    assert front_end_processes(auto, "cuda", 16) == 4
    assert front_end_processes(auto, "cuda", 4) == 1   # too few CPUs for processes of their own
    monkeypatch.setenv("SIMULSERVE_WORKERS", "3")
    assert load_settings().workers == 3
    assert front_end_processes(load_settings(), "cpu", 2) == 3   # a number given is kept
    with pytest.raises(SettingsError, match="workers"):
        load_settings(workers=-1)


def test_slow_consumers_are_dropped_where_their_messages_wait():
    """A front end counts the unsent messages of its streams, as the engine does in one process."""
    from server.frontend import FrontEndState, RemoteHandle
    from server.settings import load_settings

    class FakeSession:
        def __init__(self):
            self.out, self.killed = asyncio.Queue(), None

        def kill(self, code):
            self.killed = code

    front = FrontEndState.__new__(FrontEndState)
    front.settings = load_settings(max_output_messages=10)
    fast, slow = FakeSession(), FakeSession()
    front.streams = {1: (fast, RemoteHandle(1)), 2: (slow, RemoteHandle(2))}
    word = {"type": "word", "text": "x"}
    front._deliver([(1, [word] * 5, 3), (2, [word] * 11, 4), (3, [word], 1)])   # stream 3 has gone
    assert fast.killed is None and fast.out.qsize() == 5 and front.streams[1][1].read == 3
    assert slow.killed == "slow_consumer" and front.streams[2][1].read == 4


def test_metrics_merge_sums_series_and_keeps_one_family():
    from prometheus_client import generate_latest

    from server.metrics import Metrics
    from server.metrics_merge import Merged, snapshot
    a, b = Metrics(), Metrics()
    a.errors.labels("bad_json").inc(2)
    b.errors.labels("bad_json").inc(3)
    b.errors.labels("rate_limited").inc()
    a.batch_size.labels("m").observe(3)
    b.batch_size.labels("m").observe(300)
    text = generate_latest(Merged([snapshot(a.registry), snapshot(b.registry)])).decode()
    assert text.count("# TYPE simulserve_errors_total counter") == 1
    assert 'simulserve_errors_total{code="bad_json"} 5.0' in text
    assert 'simulserve_errors_total{code="rate_limited"} 1.0' in text
    assert 'simulserve_batch_size_count{model="m"} 2.0' in text
    assert 'simulserve_batch_size_bucket{le="4.0",model="m"} 1.0' in text \
        or 'simulserve_batch_size_bucket{model="m",le="4.0"} 1.0' in text
    assert "python_info{" in text and text.count("python_info{") == 1
