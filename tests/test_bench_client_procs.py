"""`simulserve bench server --client-procs N`: the simulated speakers spread over N client processes.

A real uvicorn server on a loopback port serves a tiny untrained wait-k model (it writes words); the
real command line runs short ramp levels against it. The figures are never asserted (two shared
cores); what is held: the table's client-CPU column, each process's CPU in the JSON, that the
parent's merged counts are every process's words (equal to what the server itself counted), and the
one-line errors for bad values.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import random_decoder
from test_server import LiveServer

from clients.cli import build_parser
from models.checkpoint import save_checkpoint
from models.data.synthetic import make_pairs
from server.bench import CLIENT_BUSY, Record, busy_warning, client_figures, split_specs

ROOT = Path(__file__).resolve().parents[1]
HEADER = ("| streams | s | words | admitted | refused | words in/s | words out/s | added p50 ms | added p99 ms "
          "| live p99 ms | after-end p99 ms | server lag p99 ms | queueing p99 ms | mean batch | mean step ms "
          "| stepping | busiest client CPU | real time |")


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, word_tok):
    d = tmp_path_factory.mktemp("client_procs_ckpt")
    save_checkpoint(d / "waitk", random_decoder(word_tok, "waitk", seed=0).model, word_tok, dtype=None)
    src = d / "source.txt"
    src.write_text("\n".join(s for s, _ in make_pairs(6, min_len=4, max_len=8, seed=7)) + "\n")
    return d / "waitk", src


def bench(url, src, out, *extra):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "clients.cli", "bench", "server", "--url", url, "--model", "bench",
           "--input", str(src), "--level-seconds", "2", "--min-words", "10", "--wpm", "300", "--max-p99-ms", "1000000",
           "--skip", "throughput,soak", "--json", str(out), *extra]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_speakers_spread_over_client_processes_lose_no_word(tiny_checkpoint, tmp_path, one_torch_thread):
    ckpt, src = tiny_checkpoint
    with LiveServer(models={"bench": str(ckpt)}, max_connections_per_ip=0, rate_limit=10000,
                    rate_burst=10000) as srv:
        counted = lambda name: srv.metric(name, model="bench")  # noqa: E731
        words_in, words_out = counted("simulserve_source_words_total"), counted("simulserve_target_words_total")
        out = tmp_path / "procs2.json"
        # levels 1 and 4 over 2 processes: at level 1 the second process has no speaker and idles
        r = bench(srv.url, src, out, "--levels", "1,4", "--client-procs", "2")
        assert r.returncode == 0, r.stdout + r.stderr
        server_in = counted("simulserve_source_words_total") - words_in
        server_out = counted("simulserve_target_words_total") - words_out

        out1 = tmp_path / "procs1.json"   # the default, one process (this process is the client)
        r1 = bench(srv.url, src, out1, "--levels", "2")
        assert r1.returncode == 0, r1.stdout + r1.stderr

    lines = r.stdout.splitlines()
    assert "clients: spread over 2 client processes" in lines
    head = lines.index(HEADER)
    rows = lines[head + 2:head + 4]
    assert [row.split("|")[1].strip() for row in rows if row.startswith("|")] == ["1", "4"], r.stdout
    for row in rows:   # every speaker admitted (this server admits all); the busiest process's CPU share, in %
        assert row.split("|")[4].strip() == row.split("|")[1].strip() and row.split("|")[5].strip() == "0", row
        assert row.split("|")[17].strip().endswith("%"), row
    per_proc = lines.index("| streams | proc 1 | proc 2 |")   # each process's CPU, level by level
    assert lines[per_proc + 2].split("|")[3].strip() == "idle"
    assert lines[per_proc + 3].split("|")[2].strip().endswith("%")

    fig = json.loads(out.read_text())
    assert fig["client_procs"] == 2
    levels = fig["ramp"]
    assert [lv["streams"] for lv in levels] == [1, 4]
    # --min-words 10 at 300 wpm: one speaker needs 0.5 s of warm-up + 10 words x 0.2 s, longer than --level-seconds
    # 2; four say them in 0.5 s, and keep the 2 s
    assert [lv["seconds"] for lv in levels] == [pytest.approx(2.5), 2.0]
    for row, lv in zip(rows, levels):   # the words the p99 is of, as the table prints them
        assert int(row.split("|")[3]) == lv["p99_words"] and 0 < lv["p99_words"] <= lv["timed_words"], row
    assert levels[0]["client_procs_cpu"][1] is None and levels[0]["client_procs_cpu"][0] >= 0
    assert all(c >= 0 for c in levels[1]["client_procs_cpu"])
    for lv in levels:
        assert lv["client_cpu"] == max(c for c in lv["client_procs_cpu"] if c is not None)
        assert lv["client_busy"] == (lv["client_cpu"] > CLIENT_BUSY)
        assert lv["words_in"] > 0 and lv["words_out"] > 0 and not lv["errors"], lv
        assert lv["timed_words"] == lv["words_out"]   # every word's delay came back from its process
        # the server's lag of a word is within its added delay, and both p99s are of the same words (after the
        # warm-up): the lag's p99 cannot be above the delay's
        assert 0 < lv["server_lag_p99_ms"] <= lv["p99_ms"] + 0.01, lv
        assert 0 < lv["step_busy"] <= 1.05   # a share of the time between the scrapes (one engine thread)
    # the merged counts are what the processes sent and received, word for word as the server counted
    assert sum(lv["words_in"] for lv in levels) == server_in
    assert sum(lv["words_out"] for lv in levels) == server_out

    lines1 = r1.stdout.splitlines()
    assert HEADER in lines1 and not any(ln.startswith("clients: spread over") for ln in lines1)
    assert not any(ln.startswith("| streams | proc 1") for ln in lines1)
    fig1 = json.loads(out1.read_text())
    assert fig1["client_procs"] == 1 and len(fig1["ramp"][0]["client_procs_cpu"]) == 1
    assert fig1["ramp"][0]["client_cpu"] == fig1["ramp"][0]["client_procs_cpu"][0]


@pytest.mark.parametrize("value, message", [
    ("0", "argument --client-procs: must be at least 1 (1 runs every speaker in this process), got 0"),
    ("-3", "argument --client-procs: must be at least 1 (1 runs every speaker in this process), got -3"),
    ("two", "argument --client-procs: expected a whole number of client processes, got 'two'"),
])
def test_a_bad_client_procs_is_a_one_line_error(value, message):
    argv = ["bench", "server", "--client-procs", value]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as e:
        build_parser(argv).parse_args(argv)
    assert e.value.code == 2
    assert err.getvalue().strip().splitlines()[-1] == f"simulserve bench server: error: {message}"
    assert build_parser(argv[:2]).parse_args(argv[:2]).client_procs == 1   # the default: one process


def test_speakers_are_dealt_evenly_and_records_merge_word_by_word():
    assert [len(s) for s in split_specs(list(range(7)), 3)] == [3, 2, 2]
    assert split_specs([1], 3) == [[1], [], []]   # more processes than speakers: the rest idle
    assert sorted(x for s in split_specs(list(range(10)), 4) for x in s) == list(range(10))
    a, b = Record(), Record()
    a.added, a.lag_ms, a.words_in, a.words_out, a.sentences = [(1.0, 0.01, False)], [(1.0, 5.0)], 3, 1, 1
    b.added, b.lag_ms, b.words_in, b.words_out, b.sentences = ([(2.0, 0.2, True), (2.5, 0.3, True)],
                                                               [(2.0, 7.0), (2.5, 8.0)], 4, 2, 1)
    b.errors["timeout"] += 1
    a.admitted, a.refused, a.waits, b.admitted, b.refused, b.waits, b.waiting = 2, 1, [1.5], 3, 4, [2.0, 7.0], 1
    merged = Record()
    merged.merge(a)
    merged.merge(b)
    # every word, not summaries
    assert merged.added == a.added + b.added and merged.lag_ms == [(1.0, 5.0), (2.0, 7.0), (2.5, 8.0)]
    assert (merged.words_in, merged.words_out, merged.sentences, dict(merged.errors)) == (7, 3, 2, {"timeout": 1})
    assert (merged.admitted, merged.refused, merged.waits, merged.waiting) == (5, 5, [1.5, 2.0, 7.0], 1)
    fig = client_figures(merged, [0.3, None, 0.95])
    assert (fig["client_cpu"], fig["client_busiest_proc"], fig["client_busy"]) == (0.95, 3, True)
    assert busy_warning("400 speakers", fig) == (
        "warning: 400 speakers: client process 3 was 95 % busy: the figure may measure the client, not the "
        "server; raise --client-procs")
    assert busy_warning("25 speakers", client_figures(merged, [0.5])) is None


def test_the_throughput_table_shows_each_jobs_cycle_against_its_step(tiny_checkpoint, tmp_path, one_torch_thread):
    """Flat out, the table prints steps/s, the job cycle (wall / steps), the mean step and the stepping share,
    from the server's own step histogram: a step is part of its job's cycle, so cycle >= step, and the share is
    their ratio. A sentence too long for the model's positions is refused and counted, and its flooder goes on
    with the next one (it used to wait for a translation that never comes, and the run hung)."""
    ckpt, short = tiny_checkpoint
    src = tmp_path / "with_a_long_one.txt"
    src.write_text(short.read_text() + " ".join(["a"] * 60) + "\n")   # 60 subwords: the tiny model has 48 positions
    with LiveServer(models={"bench": str(ckpt), "solo": str(ckpt)}, max_connections_per_ip=0, rate_limit=10000,
                    rate_burst=10000) as srv:
        steps_before = srv.metric("simulserve_step_seconds_count", model="bench")
        out = tmp_path / "flat.json"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        r = subprocess.run([sys.executable, "-m", "clients.cli", "bench", "server", "--url", srv.url,
                            "--model", "bench", "--unbatched-model", "solo", "--input", str(src),
                            "--skip", "ramp,soak", "--max-words", "60",
                            "--throughput-streams", "4", "--throughput-seconds", "2", "--json", str(out)],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        steps = srv.metric("simulserve_step_seconds_count", model="bench") - steps_before
    lines = r.stdout.splitlines()
    head = lines.index("| engine | target words/s | source words/s | sentences/s | mean batch | steps/s | cycle ms "
                       "| mean step ms | stepping |")
    cells = [c.strip() for c in lines[head + 2].split("|")[1:-1]]
    assert cells[0] == "batched (bench)" and cells[-1].endswith("%")
    batched = json.loads(out.read_text())["throughput"]["rows"][0]
    assert batched["steps_per_s"] > 0 and 0 < batched["mean_step_ms"] <= 1000 / batched["steps_per_s"]
    assert batched["step_busy"] == pytest.approx(batched["steps_per_s"] * batched["mean_step_ms"] / 1000)
    # (the server's count includes the steps that finished the phase's last sentences after the clients stopped)
    assert batched["steps_per_s"] * 2 <= steps
    assert float(cells[6]) == pytest.approx(1000 / batched["steps_per_s"], abs=0.05)
    assert batched["errors"]["sentence_too_long"] > 0 and batched["sentences"] > 0
    assert any(ln.startswith("errors, batched: sentence_too_long ") for ln in lines)


def test_the_viewers_phase_follows_a_shared_speaker_with_every_viewer(tiny_checkpoint, tmp_path, one_torch_thread):
    """`--viewers 0,3`: one more speaker shares its stream, 3 viewers follow its feed; every viewer gets an event
    for every word the shared speaker got (none missed), and each event's lag is measured."""
    ckpt, src = tiny_checkpoint
    with LiveServer(models={"bench": str(ckpt)}, max_connections_per_ip=0, rate_limit=10000,
                    rate_burst=10000) as srv:
        out = tmp_path / "viewers.json"
        r = bench(srv.url, src, out, "--viewers", "0,3", "--viewers-speakers", "2", "--skip", "ramp,throughput,soak")
        assert r.returncode == 0, r.stdout + r.stderr
        assert srv.metric("simulserve_viewers") == 0 and srv.metric("simulserve_shared_feeds") == 0
    rows = [line for line in r.stdout.splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    assert [row.split("|")[1].strip() for row in rows] == ["0", "3"], r.stdout
    fig = json.loads(out.read_text())["viewers"]
    assert [f["viewers"] for f in fig] == [0, 3] and all(f["streams"] == 2 for f in fig)
    assert fig[1]["shared_words"] > 0 and fig[1]["events_missed"] == 0
    assert fig[1]["lag_p50_ms"] <= fig[1]["lag_p99_ms"] <= fig[1]["lag_max_ms"] < 10_000
