"""`simulserve serve --engines 2`: two engine processes behind the front ends behave as one process does, and
share the streams.

test_server.py's equivalence, fifty-stream, bad-input and disconnect tests and test_admission.py's flood run
unchanged against a real `simulserve serve --workers 2 --engines 2` (test_workers.py's WorkersServer); the tests
after them cover what only several engine processes have: streams spread over both, one /metrics and one
/v1/models for the whole server, one step form, the routing order and the spill-over of a refused
stream, the spreading over GPUs and the combined headroom.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import subprocess
import sys

import httpx
import pytest
from websockets.asyncio.client import connect

import test_workers as workers
from conftest import ROOT
from test_server import talk
from test_server_limits import START, TAIL
from test_workers import WorkersServer, reference  # noqa: F401 - (reference: a fixture TestServer uses)

ENGINES = 2


class TestServer(workers.TestServer):
    """test_workers.py's: test_server.py's endpoints, equivalence per policy, fifty streams, bad input,
    disconnect, against --engines 2."""
    engines = ENGINES

    def test_streams_spread_over_both_engines_and_one_scrape_counts_them(self, server):
        """Eight open streams: /v1/models shows each engine process holding some and all eight in all; their
        words, stepped in two processes, add up in one /metrics."""
        before = server.metric("simulserve_target_words_total", model="waitk")

        async def main():
            socks = [await connect(server.url) for _ in range(8)]
            for ws in socks:
                await ws.send(json.dumps({"type": "start", "model": "waitk", "k": 1}))
                assert json.loads(await ws.recv())["type"] == "ready"
            info = await asyncio.to_thread(lambda: httpx.get(server.http + "/v1/models").json())
            words = 0
            for ws in socks:
                await ws.send(json.dumps({"type": "words", "words": ["haus", "baum", "haus"]}))
                await ws.send(json.dumps({"type": "end_stream"}))
                async for raw in ws:
                    words += json.loads(raw)["type"] == "word"
            return info, words

        info, words = asyncio.run(main())
        waitk = next(m for m in info["models"] if m["name"] == "waitk")
        spread = [e["active_streams"] for e in waitk["engine_processes"]]
        assert len(spread) == ENGINES and all(spread) and sum(spread) == 8 == waitk["active_streams"], spread
        assert {e["device"] for e in waitk["engine_processes"]} == {"cpu"}
        assert words > 0
        assert server.wait_metric("simulserve_target_words_total", before + words, model="waitk") == before + words
        assert server.metric("simulserve_models_loaded") == len(info["models"])   # the largest, not the sum
        health = httpx.get(server.http + "/health").json()
        assert health["status"] == "ok" and health["active_streams"] == 0


class TestAdmission(workers.TestAdmission):
    """test_admission.py's flood: each engine process admits by its own headroom (a front end tries the other
    engine when one refuses); every client gets in on retry and writes what it writes alone."""
    engines = ENGINES


def test_with_step_auto_every_engine_runs_the_form_the_first_one_timed(trained):
    """`auto` times the forms in engine process 1 only; the others load the model in the form it chose (timed in
    each, the choices could differ, and a stream's words with them)."""
    with WorkersServer(engines=ENGINES, step="auto", models={"waitk": str(trained["waitk"])}) as srv:
        waitk = httpx.get(srv.http + "/v1/models").json()["models"][0]
        engines = waitk["engine_processes"]
        assert [e["step_form_timed"] for e in engines] == [True, False], engines
        assert {e["step_form"] for e in engines} == {waitk["step_form"]["choice"]["form"]}, engines
        received, code = asyncio.run(talk(srv.url, [START] + TAIL))
        assert code == 1000 and any(m["type"] == "word" for m in received)


def test_a_new_stream_goes_to_the_engine_with_the_fewest():
    from server.frontend import FrontEndState
    front = FrontEndState.__new__(FrontEndState)
    front.links, front.worker = [None] * 3, 1
    front.streams_on = [0, 0, 0]
    assert front.engine_order() == [1, 2, 0]          # ties: round from the front end's own number
    front.worker = 2
    assert front.engine_order()[0] == 2
    front.streams_on = [4, 1, 3]
    assert front.engine_order() == [1, 2, 0]          # the fewest first, then the next fewest


def test_engine_processes_spread_over_the_gpus_a_bare_cuda_names():
    from server.settings import engine_device
    assert [engine_device("cuda", i, 2) for i in range(3)] == ["cuda:0", "cuda:1", "cuda:0"]
    assert engine_device("auto", 3, 4) == "cuda:3"
    assert engine_device("cuda:1", 0, 4) == engine_device("cuda:1", 1, 4) == "cuda:1"   # named in full: that one
    assert engine_device("cuda", 1, 1) == "cuda" and engine_device("auto", 1, 0) == "auto"
    assert engine_device("cpu", 1, 4) == "cpu"


def test_headroom_of_several_engines_adds_up_and_keeps_the_worst():
    from server.admission import Headroom, combine

    def part(streams, state, p99):
        return Headroom(streams=streams, capacity=streams + 10, live=10, delay_budget_ms=100.0, state=state,
                        p99_ms=p99, lag_p99_ms=p99, loop_p99_ms=None, rows_per_stream_s=4.0, demand_rows_s=40.0,
                        max_demand_rows_s=90.0, cycle_ms=5.0, delay_in_cycles=3.0, busy=0.5)

    one = part(7, "measured", 60.0)
    assert combine([one]) is one
    both = combine([one, part(3, "over_budget", None)])
    assert (both.streams, both.capacity, both.live, both.demand_rows_s) == (10, 30, 20, 80.0)
    assert both.state == "over_budget" and both.p99_ms == 60.0 and both.loop_p99_ms is None
    assert combine([part(1, "cold", None), part(1, "cold", None)]).state == "cold"
    assert combine([part(1, "cold", None), part(1, "measured", 9.0)]).state == "measured"


def test_engines_setting_is_checked_and_auto_picks_two_on_a_multi_core_cpu_or_a_gpu():
    from server.settings import ServerSettings, SettingsError, engine_processes, load_settings
    assert load_settings().engines == 0                              # auto
    assert load_settings(engines=3).transport.engines == 3
    with pytest.raises(SettingsError, match="engines"):
        load_settings(engines=-1)
    with pytest.raises(SettingsError, match="engines"):
        load_settings(engines=17)
    cpu = load_settings(device="cpu")
    assert engine_processes(cpu, cpus=2, memory_gib=4) == 2 and engine_processes(cpu, cpus=16, memory_gib=64) == 2
    assert engine_processes(cpu, cpus=1, memory_gib=64) == 1         # one core: one interpreter is enough
    assert engine_processes(cpu, cpus=2, memory_gib=3.5) == 1        # the models twice would not fit well
    gpu = load_settings(device="cuda")
    assert engine_processes(gpu, device_type="cuda", cpus=16, memory_gib=64) == 2   # one interpreter bounds a GPU too
    assert engine_processes(gpu, device_type="cuda", cpus=4, memory_gib=64) == 1    # too few CPUs beside 4 front ends
    assert engine_processes(gpu, device_type="cuda", cpus=16, memory_gib=3) == 1
    assert engine_processes(gpu, device_type="mps", cpus=16, memory_gib=64) == 1    # not measured there
    assert engine_processes(load_settings(device="cpu", engines=3), cpus=1, memory_gib=1) == 3   # the setting wins
    assert engine_processes(cpu) in (1, 2)                           # this machine's own figures
    run = subprocess.run([sys.executable, "-m", "clients.cli", "serve", "--ray", "--engines", "2"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--replicas" in run.stderr, run.stderr
    # the flags' help is the settings' description: the auto rule is written once
    usage = subprocess.run([sys.executable, "-m", "clients.cli", "serve", "--help"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "1000"})
    described = ServerSettings.model_fields["engines"].description
    assert described.startswith("engine processes") and described in usage.stdout, usage.stdout[-2000:]
    assert ServerSettings.model_fields["workers"].description in usage.stdout


def test_a_refused_stream_is_tried_on_the_next_engine_and_counted_where_it_lands():
    """RemoteSession._attach over real links (server/ipc.py on socket pairs) to two stand-in engine processes
    whose admission answers are set by the test: the least loaded is asked first, a refusal sends the stream to
    the next, all refusing gives the client the last refusal, and each front end's counts follow. Only the last
    engine asked is told its refusal is final (the others' do not count as refused clients)."""
    from types import SimpleNamespace

    from server.frontend import FrontEndState, RemoteEngine, RemoteSession
    from server.ipc import Link
    from server.ipc_messages import Attach, Detach, Reply
    from server.protocol import error

    async def main():
        busy = error("server_busy", "full", retry_after=1.0)
        verdicts = [None, None]          # what each engine answers the next Attach
        asked, detached, finals = [], [], []
        front_links, tasks = [], []
        for i in range(2):
            a, b = socket.socketpair()
            front_links.append(Link(*await asyncio.open_connection(sock=a)))
            engine_link = Link(*await asyncio.open_connection(sock=b))

            def handle(m, i=i, link=engine_link):
                if type(m) is Attach:
                    asked.append(i)
                    finals.append(m.final)
                    link.send(Reply(m.req, verdicts[i]))
                elif type(m) is Detach:
                    detached.append((i, m.stream))
            tasks += [asyncio.create_task(engine_link.serve(handle)),
                      asyncio.create_task(front_links[-1].serve(lambda m: None))]
        front = FrontEndState.__new__(FrontEndState)
        front.links, front.worker, front.streams_on = front_links, 2, [0, 0]
        front.streams, front.stream_ids = {}, itertools.count(1)
        session = RemoteSession.__new__(RemoteSession)
        session.srv, session.conn = front, 7
        model = RemoteEngine.__new__(RemoteEngine)
        model.name, model.front = "waitk", front
        msg = SimpleNamespace(k=2, delta=None)

        h1, refused = await session._attach(model, None, msg)        # ties: from the front end's number
        assert refused is None and h1.engine == 0 and asked == [0] and front.streams_on == [1, 0]
        verdicts[1] = busy                                            # the least loaded refuses: the next admits
        h2, refused = await session._attach(model, None, msg)
        assert refused is None and h2.engine == 0 and asked[1:] == [1, 0] and front.streams_on == [2, 0]
        verdicts[0] = busy                                            # both refuse: the client hears it
        h3, refused = await session._attach(model, None, msg)
        assert h3 is None and refused["code"] == "server_busy" and asked[3:] == [1, 0]
        assert front.streams_on == [2, 0] and set(front.streams) == {h1.id, h2.id}
        assert finals == [False, False, True, False, True]   # (h1 admitted by the first: never final)
        model.detach(h1)
        await asyncio.sleep(0.05)
        assert front.streams_on == [1, 0] and detached == [(0, h1.id)]
        for link in front_links:
            link.close()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())


def test_each_engine_holds_its_share_of_max_streams(trained):
    """--engines 2 with max_streams 4 and the graphs form (fixed shapes, run eagerly on the CPU): each engine
    process's cache pool holds 2 streams, not 4; four streams at once all translate, the fifth is server_full."""
    with WorkersServer(workers=1, engines=ENGINES, step="graphs", max_streams=4,
                       models={"waitk": str(trained["waitk"])}) as srv:
        waitk = httpx.get(srv.http + "/v1/models").json()["models"][0]
        assert [e["max_streams"] for e in waitk["engine_processes"]] == [2, 2] and waitk["max_streams"] == 4
        assert waitk["graphs"]["replayed"] is False   # (the CPU: the captured shapes run eagerly)

        async def main():
            socks = [await connect(srv.url) for _ in range(4)]
            for ws in socks:
                await ws.send(json.dumps({"type": "start", "model": "waitk", "k": 1}))
                assert json.loads(await ws.recv())["type"] == "ready"
            extra = await talk(srv.url, [START] + TAIL)
            words = []
            for ws in socks:
                await ws.send(json.dumps({"type": "words", "words": ["haus", "baum"]}))
                await ws.send(json.dumps({"type": "end_stream"}))
                words.append(len([raw async for raw in ws if json.loads(raw)["type"] == "word"]))
            return extra, words

        (extra, code), words = asyncio.run(main())
        assert all(words), words
        assert [m["code"] for m in extra if m["type"] == "error"] == ["server_full"]


def test_a_full_engine_refuses_a_new_stream_until_one_leaves(trained):
    """ModelEngine.admit with the graphs form's fixed pool: at `capacity` streams the next gets server_busy (a
    front end then tries the next engine process); once one leaves, a stream may start."""
    from conftest import decoder_from
    from server.admission import Admission
    from server.engine import ModelEngine
    from server.metrics import Metrics
    from models.step import StreamingDecoder

    async def main():
        base = decoder_from(trained["waitk"])
        dec = StreamingDecoder(base.model, base.tok, form="graphs")
        eng = ModelEngine("waitk", dec, metrics=Metrics(), capacity=2, max_batch=2, admission=Admission(enabled=False))
        await eng.start()
        try:
            handles = []
            for _ in range(2):
                assert eng.admit() is None
                handles.append(eng.attach(eng.policy_for(1, None), asyncio.Queue()))
            busy = eng.admit()
            assert busy["code"] == "server_busy" and busy["retry_after"] == 1.0
            eng.detach(handles[0])
            assert eng.admit() is None
        finally:
            await eng.stop()

    asyncio.run(main())


def test_bench_server_starts_its_server_with_engines_and_says_so(trained, tmp_path):
    """`bench server --engines 2` passes the setting to the server it starts, names the engine processes in its
    header and measures words through both."""
    source = tmp_path / "src.de"
    source.write_text("haus baum haus\nbaum haus\n")
    r = subprocess.run([sys.executable, "-m", "clients.cli", "bench", "server", "--checkpoint", str(trained["waitk"]),
                        "--device", "cpu", "--step", "default", "--engines", "2", "--no-admission", "--input",
                        str(source), "--skip", "ramp,soak", "--throughput-streams", "8", "--throughput-seconds", "2",
                        "--json", str(tmp_path / "out.json")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "engine processes: 2 (cpu, default, " in r.stdout, r.stdout
    assert "2 engine processes" in r.stderr, r.stderr
    rows = json.loads((tmp_path / "out.json").read_text())
    assert len(rows["model"]["engine_processes"]) == 2
    assert rows["throughput"]["rows"][0]["target_words_per_s"] > 0
