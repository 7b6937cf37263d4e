"""`simulserve bench step`'s host-overhead table and the benchmarks' --device.

The figures themselves are printed by the benchmark, never asserted; these tests hold what
can fail: the compute rule of the CPU kernel time, the upload/read counts on code with a known
number of each, that timing and profiling leave the outputs and the step count alone, and
the real command line (its table, its JSON, its one-line errors).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import random_decoder

from clients.cli import build_parser
from models.benchmarks.host_overhead import (STEP_MARK, TimedDecoder, bench_host_overhead, compute_op_time,
                                             device_timeline, profile_traffic)
from models.checkpoint import CheckpointError, pick_device, save_checkpoint
from models.data.synthetic import make_pairs
from models.step import StreamingDecoder
from models.translate import simulate

ROOT = Path(__file__).resolve().parents[1]
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where no CUDA device exists")


class FakeEvent:
    """The four things compute_op_time reads of a profiler event."""

    def __init__(self, name, start, end, thread=1):
        self._n, self._s, self._d, self._t = name, start, end - start, thread

    def name(self):
        return self._n

    def start_ns(self):
        return self._s

    def duration_ns(self):
        return self._d

    def start_thread_id(self):
        return self._t


def test_cpu_kernel_time_counts_the_innermost_compute_operators_only():
    events = [
        FakeEvent("aten::linear", 0, 100), FakeEvent("aten::t", 5, 10),          # a wrapper: only dispatch
        FakeEvent("aten::addmm", 10, 90), FakeEvent("aten::empty", 12, 15),     # addmm: 80 - 3
        FakeEvent("aten::max", 100, 150), FakeEvent("aten::empty", 101, 103),  # helpers only below: 50 - 4
        FakeEvent("aten::fill_", 103, 105),
        FakeEvent("aten::index", 200, 260), FakeEvent("aten::nonzero", 210, 220),
        FakeEvent("aten::add", 230, 240),                                       # under indexing: not compute
        FakeEvent("aten::item", 300, 310), FakeEvent("aten::_local_scalar_dense", 301, 309),
        FakeEvent("mkldnn::_linear_pointwise", 400, 450),                       # 50
        FakeEvent("cudaLaunchKernel", 460, 470),                                # not an operator
        FakeEvent("aten::mul", 0, 30, thread=2),                                # another thread: 30
    ]
    assert compute_op_time(events) == pytest.approx((77 + 46 + 50 + 30) / 1e9)


def test_uploads_and_reads_are_counted_on_code_with_a_known_number_of_each():
    x, mask = torch.arange(6.0), torch.tensor([True, False] * 3)

    def work():
        a = torch.tensor([1, 2, 3])              # 1 upload
        b = x[mask]                              # 1 read (aten::nonzero)
        c = int(b.sum())                         # 1 read (aten::_local_scalar_dense)
        d = (x * 2).tolist()                     # 1 read (tolist: no operator on CPU)
        return a, c, d

    with torch.inference_mode():
        out = profile_traffic(work)
    assert out["result"][1] == 6 and out["result"][2] == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert (out["uploads"], out["reads"]) == (1, 3)
    assert out["kernel_s"] > 0 and "memcpy" not in out


def test_device_timeline_splits_each_steps_idle_device_time():
    """Per step: idle before its first device activity, between its activities (the span less their union:
    overlapping ones count once), after its last; a step with none is idle before, all of it; an activity
    that starts outside every step counts nowhere, one that runs past its step's end is cut there."""
    steps = [(0, 100), (200, 300), (400, 450)]
    device = [(60, 70), (10, 30), (25, 40), (210, 290), (150, 160)]
    t = device_timeline(steps, device)
    ns = {k: round(v * 1e9) for k, v in t.items() if k.endswith("_s")}
    assert ns == {"idle_before_s": 10 + 10 + 50, "idle_between_s": 20, "idle_after_s": 30 + 10,
                  "busy_s": 30 + 10 + 80} and t["steps"] == 3
    # (every nanosecond of every step is in exactly one part)
    assert sum(ns.values()) == sum(b - a for a, b in steps)
    late = device_timeline([(0, 100)], [(50, 150)])
    assert round(late["busy_s"] * 1e9) == 50 and late["idle_after_s"] == 0
    assert device_timeline([], device)["steps"] == 0


def test_waits_go_on_the_wait_clock_only_when_one_is_kept(word_tok):
    """The read back's event and a clock's synchronize share one way onto `wait_seconds`: timed when a benchmark
    keeps the clock, untouched (None) otherwise; off CUDA there is nothing to synchronize."""
    import time as clock
    dec = random_decoder(word_tok, "waitk", seed=4)
    calls = []
    dec._wait(lambda: calls.append(1))
    assert calls == [1] and dec.wait_seconds is None
    dec.wait_seconds = 0.0
    dec._wait(lambda: clock.sleep(0.02))
    assert 0.015 < dec.wait_seconds < 1.0
    before = dec.wait_seconds
    dec.synchronize()   # (the CPU: no wait, nothing added)
    assert dec.wait_seconds == before and dec.device.type == "cpu"


def test_timed_steps_are_marked_for_the_profiler_only_when_asked(word_tok):
    """TimedDecoder.mark_steps: one STEP_MARK region per step (the device timeline's windows), none by default
    (a region costs host time in the timed rounds)."""
    from torch.profiler import ProfilerActivity, profile
    model = random_decoder(word_tok, "waitk", seed=3).model
    sentences = [s for s, _ in make_pairs(3, seed=8)]
    timed = TimedDecoder(model, word_tok)
    for mark in (False, True):
        timed.step_seconds, timed.mark_steps = [], mark
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            simulate(timed, sentences, batch_size=2)
        marks = [e for e in prof.profiler.kineto_results.events() if e.name() == STEP_MARK]
        assert len(marks) == (len(timed.step_seconds) if mark else 0) and timed.step_seconds
        assert all(e.end_ns() > e.start_ns() for e in marks)


def test_a_cuda_row_of_the_table_gives_the_device_idle_parts():
    """bench step's row on CUDA: the device's idle time before / between / after its activities per step, or
    n/a where the profile marked no step; the host's split of the wall (graph forms); a CPU row has no CUDA
    columns."""
    from clients.bench_cli import host_overhead_row
    row = {"path": "graphs-encoder", "batch_size": 8, "steps": 103, "encoding_share": 0.17, "step_wall_ms": 0.74,
           "kernel_ms_per_step": 0.458, "wall_over_kernel": 1.62, "operators_per_step": 8, "uploads_per_step": 0,
           "reads_per_step": 0.8, "decoder_rows_per_step": 2.35, "identical": True, "same_as_first": True}
    cuda = {**row, "launches_per_step": 1.0, "memcpy_per_step": 1.7, "syncs_per_step": 0.8}
    timed = {**cuda, "device_idle_before_ms": 0.1, "device_idle_between_ms": 0.125, "device_idle_after_ms": 0.05,
             "activities_per_step": 212.4, "graph_span_ms_per_step": 0.6125}
    assert ("| 1.0 | 1.7 | 0.8 | 212 | 0.613 | 0.100 / 0.125 / 0.050 | n/a | 2.4 | yes | yes |"
            in host_overhead_row(timed, True))
    assert "| 0.8 | n/a | n/a | n/a | n/a | 2.4 | yes |" in host_overhead_row(cuda, True)
    split = {**timed, "host_python_ms_per_step": 0.1004, "graph_launch_ms_per_step": 0.0216, "wait_ms_per_step": 0.618}
    assert "| 0.100 / 0.125 / 0.050 | 0.100 / 0.022 / 0.618 | 2.4 | yes | yes |" in host_overhead_row(split, True)
    cpu = host_overhead_row(row, False)
    assert cpu.count("|") == 16 and "| 0.282 | n/a | 1.62x |" in cpu   # (host ms: wall less kernel; not a graph form)
    assert "| 0.282 | 0.127 | 1.62x |" in host_overhead_row({**row, "outside_graphs_ms_per_step": 0.1274}, False)
    older = {k: v for k, v in row.items() if k != "decoder_rows_per_step"}   # (a report from before the column)
    assert host_overhead_row(older, False).endswith("| n/a | yes | yes |")


def test_timed_and_profiled_steps_compute_what_the_plain_decoder_does(word_tok):
    """Counting each step call once (advance calls step), and changing no output."""
    calls = []

    class Counting(StreamingDecoder):
        def step(self, states):
            calls.append(len(states))
            return super().step(states)

    model = random_decoder(word_tok, "gma", seed=3).model
    sentences = [s for s, _ in make_pairs(5, seed=8)]
    plain = simulate(Counting(model, word_tok), sentences, batch_size=2)
    timed = TimedDecoder(model, word_tok)
    prof = profile_traffic(lambda: simulate(timed, sentences, batch_size=2))
    assert len(timed.step_seconds) == len(calls) > 0 and all(t > 0 for t in timed.step_seconds)
    assert [(r.prediction, r.token_delays) for r in prof["result"]] == [(r.prediction, r.token_delays)
                                                                         for r in plain]


def test_host_overhead_rows(word_tok):
    dec = random_decoder(word_tok, "gma", seed=4)
    sentences = [s for s, _ in make_pairs(6, seed=5)]
    rows = bench_host_overhead(dec.model, word_tok, sentences, batch_sizes=(1, 3), sentences=4, rounds=2)
    assert [r["batch_size"] for r in rows] == [1, 3]
    plain = simulate(StreamingDecoder(dec.model, word_tok), sentences[:4])
    for r in rows:
        assert r["identical"] and r["sentences"] == 4 and r["steps"] > 0
        assert r["target_tokens"] == sum(p.target_tokens for p in plain)
        assert 0 < r["kernel_ms_per_step"] < r["step_wall_ms"]
        assert r["wall_over_kernel"] == pytest.approx(r["step_wall_ms"] / r["kernel_ms_per_step"])
        for key in ("uploads_per_step", "reads_per_step"):   # whole events per profiled round
            total = r[key] * r["steps"]
            assert total >= 0 and total == pytest.approx(round(total))
        assert r["reads_per_step"] > 0   # the step reads its decisions back every time
    assert rows[0]["steps"] > rows[1]["steps"]   # batching 3 streams per step needs fewer steps


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))])
def test_a_graph_form_row_gives_the_time_outside_its_graphs(word_tok, device):
    """Off CUDA the graph forms replay their bodies eagerly; the row's `outside graphs` time is the wall less those
    bodies: more than nothing (the step plans, uploads, applies results), less than the wall (the bodies are
    most of it). A form without graphs has no such figure. On CUDA the graph rows also split the wall by the
    host's clock into host Python, graph launches and waits for the device, which add up to the median round's
    wall (3 rounds: the median is one of them)."""
    dec = random_decoder(word_tok, "waitk", seed=4)
    sentences = [s for s, _ in make_pairs(6, seed=5)]
    rows = bench_host_overhead(dec.model.to(device), word_tok, sentences, batch_sizes=(1, 4), sentences=4,
                               rounds=3 if device == "cuda" else 1, paths=("graphs-encoder", "sync-free"))
    graphs = [r for r in rows if r["path"] == "graphs-encoder"]
    assert len(graphs) == 2 and all(r["identical"] and r["same_as_first"] for r in rows)
    for r in graphs:
        assert 0 < r["outside_graphs_ms_per_step"] < r["step_wall_ms"]
        parts = [r.get(k) for k in ("host_python_ms_per_step", "graph_launch_ms_per_step", "wait_ms_per_step")]
        if device == "cuda":
            assert all(p > 0 for p in parts) and sum(parts) == pytest.approx(r["step_wall_ms"], rel=1e-6), parts
        else:
            assert parts == [None] * 3
    assert all("outside_graphs_ms_per_step" not in r and "host_python_ms_per_step" not in r
               for r in rows if r["path"] == "sync-free")


# ---------------------------------------------------------------- the real command line
@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, word_tok):
    d = tmp_path_factory.mktemp("bench_ckpt")
    save_checkpoint(d / "gma", random_decoder(word_tok, "gma", seed=6).model, word_tok, dtype=None)
    src = d / "source.txt"
    src.write_text("\n".join(s for s, _ in make_pairs(4, seed=7)) + "\n")
    return d / "gma", src


def cli(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "clients.cli", *args], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=300)


def test_bench_step_prints_the_host_overhead_table(tiny_checkpoint, tmp_path):
    ckpt, src = tiny_checkpoint
    out = tmp_path / "step.json"
    r = cli("bench", "step", "--device", "cpu", "--checkpoint", str(ckpt), "--source", str(src),
            "--batch-sizes", "1,2", "--sentences", "2", "--rounds", "1", "--json", str(out),
            "--paths", "host,sync-free,static", "--no-stutter", "3")
    assert r.returncode == 0, r.stderr
    assert "no_stutter 3, no_repeat_ngram 0" in r.stdout   # the decoding rules the figures were taken with
    lines = r.stdout.splitlines()
    head = lines.index("| step | batch size | steps | encoding steps | step wall ms | kernel ms/step | host ms/step | "
                       "outside graphs ms/step | wall/kernel | operators/step | uploads/step | reads/step | "
                       "decoder rows/step | identical | same as first |")
    assert lines.index("| batch size | target tokens | fast ms/token | plain ms/token | speed-up | identical |") \
        < head
    body = lines[head + 2:head + 8]
    assert [row.split("|")[1:3] for row in body] == [[f" {p} ", f" {b} "] for p in ("host", "sync-free", "static")
                                                      for b in (1, 2)]
    assert all(row.endswith("| yes | yes |") for row in body)
    for row in body:   # host time = wall - kernel, printed beside them
        wall, kernel, host = (float(row.split("|")[i]) for i in (5, 6, 7))
        assert abs(host - (wall - kernel)) < 0.011, row
    # what --step auto would choose here, with its timings, under the CPU it ran on
    assert r.stdout.count("CPU: ") == 1 and "--step auto here:" in r.stdout
    data = json.loads(out.read_text())
    rows = data["host_overhead"]
    assert data["device"] == "cpu" and [h["batch_size"] for h in rows] == [1, 2] * 3
    # the GPU form reads back once per step at most; the host form reads more (its shortcuts)
    assert all(h["reads_per_step"] <= 1.0 for h in rows if h["path"] != "host")
    assert all(h["uploads_per_step"] <= 1.0 for h in rows)
    # every step dispatches operators (tens of them per layer); the column shows them per form
    assert all(h["operators_per_step"] > 10 for h in rows)
    assert [float(row.split("|")[10]) for row in body] == [round(h["operators_per_step"]) for h in rows]
    assert all(row.split("|")[8].strip() == "n/a" for row in body)   # (no graph form ran)
    assert all(0 < h["encoding_share"] <= 1 for h in rows)
    # the decoder's real batch: at most the batch size, printed as measured, and the same in every form (they
    # step the same streams to the same decisions)
    assert all(0 < h["decoder_rows_per_step"] <= h["batch_size"] for h in rows)
    assert [float(row.split("|")[-4]) for row in body] == [round(h["decoder_rows_per_step"], 1) for h in rows]
    for b in (1, 2):
        assert len({h["decoder_rows_per_step"] for h in rows if h["batch_size"] == b}) == 1
    assert [row.split("|")[4].strip() for row in body] == [f"{100 * h['encoding_share']:.0f}%" for h in rows]
    bad = cli("bench", "step", "--device", "cpu", "--checkpoint", str(ckpt), "--source", str(src), "--paths", "jit")
    assert bad.returncode == 2 and "--paths: unknown step form(s) jit" in bad.stderr
    assert all(h["kernel_source"] == "cpu compute operators" for h in data["host_overhead"])


@NO_CUDA
@pytest.mark.parametrize("what", ["step", "engine"])
def test_bench_on_a_missing_gpu_is_a_one_line_error(what, tiny_checkpoint):
    ckpt, src = tiny_checkpoint
    r = cli("bench", what, "--device", "cuda", "--checkpoint", str(ckpt), "--source", str(src))
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == ""
    assert r.stderr.strip().splitlines()[-1] == \
        "simulserve bench: error: CUDA was requested but no CUDA device is available"


def test_bench_engine_runs_on_the_device_given(tiny_checkpoint, tmp_path):
    ckpt, src = tiny_checkpoint
    out = tmp_path / "engine.json"
    r = cli("bench", "engine", "--device", "cpu", "-m", str(ckpt), "--source", str(src), "--lengths", "3,5",
            "--count", "1", "--json", str(out))
    assert r.returncode == 0, r.stderr   # 0: streaming and naive wrote the same tokens
    (result,) = json.loads(out.read_text())
    assert result["device"] == "cpu" and [row["words"] for row in result["rows"]] == [3, 5]


def test_pick_device_names_bad_values():
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(CheckpointError, match="unknown device 'gpu'"):
        pick_device("gpu")
    with pytest.raises(CheckpointError, match="cuda:99|no CUDA device"):
        pick_device("cuda:99")


def test_bench_server_passes_device_and_dtype_to_the_server_it_starts():
    from models.errors import UserError
    from server.bench import run_server_bench, server_command, start_server
    parse = build_parser(["bench"]).parse_args
    args = parse(["bench", "server", "--checkpoint", "gma_delta1", "--device", "cpu", "--dtype", "bfloat16",
                  "--step", "compiled", "--overlap", "off"])
    cmd = server_command(args, 8123)
    assert cmd[cmd.index("--device") + 1] == "cpu" and cmd[cmd.index("--dtype") + 1] == "bfloat16"
    assert cmd[cmd.index("--port") + 1] == "8123"
    served = build_parser(cmd[3:]).parse_args(cmd[3:])   # the real `simulserve serve` parser takes it
    assert (served.command, served.device, served.dtype, served.step, served.overlap) == (
        "serve", "cpu", "bfloat16", "compiled", "off")
    assert "--device" not in server_command(parse(["bench", "server"]), 8123)   # the server's own default
    assert "--overlap" not in server_command(parse(["bench", "server"]), 8123)
    with pytest.raises(UserError, match="--device applies to the server this command starts"):
        run_server_bench(parse(["bench", "server", "--url", "ws://127.0.0.1:9/v1/stream", "--device", "cpu"]))
    if not torch.cuda.is_available():   # refused here, before any server process starts
        with pytest.raises(CheckpointError, match="CUDA"):
            start_server(parse(["bench", "server", "--device", "cuda"]))


def test_top_level_operators_counts_what_python_dispatched():
    """Operators called by another operator (linear calls addmm, ...) are not counted again."""
    from torch.profiler import ProfilerActivity, profile
    from models.benchmarks.host_overhead import top_level_operators
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        y = torch.nn.functional.linear(x, w)   # one dispatch, with aten::t / aten::mm ... inside
        y = y.relu()
        y = y + 1
    events = list(prof.profiler.kineto_results.events())
    assert top_level_operators(events) == 3
