"""`simulserve stream` (and `simulserve serve`) as a user runs them: real processes, real server."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from models.data.synthetic import make_pairs
from server.settings import SettingsError, load_settings, resolve_models
from test_server import LiveServer, make_reference

ROOT = Path(__file__).resolve().parents[1]
KEY = "client-test-key"


def cli(*args, stdin: str | None = None, timeout: float = 60, **env_vars) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SIMULSERVE_API_KEY", None)
    env.update(env_vars)
    return subprocess.run([sys.executable, "-m", "clients.cli", *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=env)


@pytest.fixture(scope="module")
def reference(trained):
    return make_reference(trained)


@pytest.fixture(scope="module")
def server(trained):
    with LiveServer(models={p: str(path) for p, path in trained.items()}, api_keys=[KEY], max_streams=2) as srv:
        yield srv


@pytest.fixture(scope="module")
def sentences(tmp_path_factory):
    lines = [s for s, _ in make_pairs(5, min_len=2, max_len=8, seed=51)]
    path = tmp_path_factory.mktemp("client") / "talk.txt"
    path.write_text("\n".join(lines) + "\n")
    return lines, path


def test_captions_equal_translate(server, sentences, reference):
    lines, path = sentences
    r = cli("stream", str(path), "--url", server.url, "--model", "waitk", "--k", "2", "--wpm", "0",
            "--api-key", KEY)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    refs = [reference("waitk", {"k": 2}, s) for s in lines]
    assert out[0::2] == [ref.prediction for ref in refs]            # translation, then its statistics
    for stats, ref in zip(out[1::2], refs):
        assert f"{ref.source_words} source words" in stats and "AL " in stats and "compute" in stats
    assert "5 sentences" in r.stderr


def test_paced_stdin_json_and_auto_segment(server, sentences, reference):
    lines, _ = sentences
    text = " ".join(s + "." for s in lines[:3])     # continuous text, cut by the server
    r = cli("stream", "--url", server.url.replace("ws://", "http://"), "--model", "gma", "--delta", "2",
            "--wpm", "3000", "--auto-segment", "--json", stdin=text + "\n", timeout=120, SIMULSERVE_API_KEY=KEY)
    assert r.returncode == 0, r.stderr
    got = [json.loads(line) for line in r.stdout.splitlines()]
    assert [m["translation"] for m in got] == \
        [reference("gma", {"delta": 2.0}, s + ".").prediction for s in lines[:3]]
    assert all(set(m["latency"]) == {"AL", "LAAL", "AP", "DAL", "CW"} for m in got if m["latency"])


def test_words_are_json_lines_as_they_arrive(server, sentences, reference):
    """`--words`: every word message as a JSON line, then its sentence's; the words join to the translation."""
    lines, _ = sentences
    r = cli("stream", "--url", server.url, "--model", "waitk", "--k", "2", "--wpm", "0", "--words",
            stdin="\n".join(lines[:3]) + "\n", timeout=120, SIMULSERVE_API_KEY=KEY)
    assert r.returncode == 0, r.stderr
    got = [json.loads(line) for line in r.stdout.splitlines()]
    assert [m["type"] for m in got if m["type"] != "word"] == ["sentence"] * 3
    for i, line in enumerate(lines[:3]):
        words = [m for m in got if m["type"] == "word" and m["sentence"] == i]
        end = next(j for j, m in enumerate(got) if m["type"] == "sentence" and m["sentence"] == i)
        assert all(got.index(w) < end for w in words)   # each word before its sentence's line
        assert " ".join(w["text"] for w in words) == got[end]["translation"] == \
            reference("waitk", {"k": 2}, line).prediction
    assert "mean AL" not in r.stderr   # (the summary is for people; these lines are for a program)
    times = [m["received_s"] for m in got if m["type"] == "word"]   # (an unpaced stream: since it opened)
    assert times and times[0] >= 0 and times == sorted(times)


def test_a_live_pipe_that_pauses_gets_its_sentence_ended(server, sentences, reference):
    """`--end-after-pause`: a live pipe (speech recognition) writes words without a full stop and pauses; the
    server ends that sentence, and its translation is printed while the pipe is still open. The option needs
    --auto-segment."""
    lines, _ = sentences
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SIMULSERVE_API_KEY": KEY}
    proc = subprocess.Popen([sys.executable, "-m", "clients.cli", "stream", "--url", server.url, "--model", "waitk",
                             "--k", "2", "--wpm", "0", "--auto-segment", "--end-after-pause", "0.3", "--json"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=env)
    guard = threading.Timer(60, proc.kill)   # (without the pause's end the first line would never come)
    guard.start()
    try:
        proc.stdin.write(lines[0] + "\n")   # no full stop
        proc.stdin.flush()
        first = json.loads(proc.stdout.readline())      # before the pipe closes: the pause ended the sentence
        proc.stdin.write(lines[1] + "\n")
        proc.stdin.close()
        out, err = proc.stdout.read(), proc.stderr.read()
        proc.wait(60)
    finally:
        guard.cancel()
        proc.kill()
    assert proc.returncode == 0, err
    assert first["source"] == lines[0] and first["translation"] == reference("waitk", {"k": 2}, lines[0]).prediction
    assert [json.loads(line)["source"] for line in out.splitlines()] == [lines[1]]
    r = cli("stream", "--url", server.url, "--end-after-pause", "1", stdin="x\n")
    assert r.returncode == 2 and "add --auto-segment" in r.stderr
    r = cli("stream", "--url", server.url, "--auto-segment", "--end-after-pause", "0", stdin="x\n")
    assert r.returncode == 2 and "0 < S <= 3600" in r.stderr


def test_clear_messages_when_unreachable_rejected_or_full(server, sentences):
    _, path = sentences
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"ws://127.0.0.1:{s.getsockname()[1]}/v1/stream"
    r = cli("stream", str(path), "--url", dead, "--api-key", KEY)
    assert r.returncode == 2 and "cannot reach the server" in r.stderr
    r = cli("stream", str(path), "--url", server.url, "--api-key", "wrong")
    assert r.returncode == 4 and "API key" in r.stderr
    r = cli("stream", str(path), "--url", server.url)
    assert r.returncode == 4 and "API key" in r.stderr
    r = cli("stream", str(path), "--url", server.url, "--api-key", KEY, "--model", "nope")
    assert r.returncode == 5 and "unknown_model" in r.stderr
    r = cli("stream", str(path), "--url", server.http + "/nothing-here", "--api-key", KEY)
    assert r.returncode == 2 and re.search(r"HTTP (403|404|500)", r.stderr), r.stderr
    # fill the server (max_streams=2) with two slow clients, then a third is told it is full
    slow = [subprocess.Popen([sys.executable, "-m", "clients.cli", "stream", str(path), "--url", server.url,
                              "--api-key", KEY, "--wpm", "60"], cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
            for _ in range(2)]
    try:
        deadline = time.monotonic() + 30
        while server.metric("simulserve_active_streams") < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        r = cli("stream", str(path), "--url", server.url, "--api-key", KEY)
        assert r.returncode == 3 and "full" in r.stderr
    finally:
        for p in slow:
            p.terminate()
            p.wait()


def test_serve_command_and_missing_models(trained, sentences, monkeypatch, tmp_path):
    monkeypatch.setattr("models.shipped.shipped_checkpoints", lambda: {})
    with pytest.raises(SettingsError, match="no model to serve"):
        resolve_models(load_settings())
    r = cli("serve", f"w={tmp_path}/missing", "--port", "1")
    assert r.returncode == 2 and "model 'w'" in r.stderr
    r = cli("serve", f"w={trained['waitk']}", "--port", "1", "--dtype", "int8")
    assert r.returncode == 2 and "dtype" in r.stderr and "Traceback" not in r.stderr
    lines, path = sentences
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SIMULSERVE_MAX_BATCH": "8", "SIMULSERVE_DTYPE": "bfloat16"}
    proc = subprocess.Popen([sys.executable, "-m", "clients.cli", "serve", f"w={trained['waitk']}", "--port",
                             str(port), "--host", "127.0.0.1", "--log-level", "warning"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        info = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["models"][0]
        assert info["name"] == "w" and info["batching"]["max_batch"] == 8   # env var settings
        assert info["dtype"] == "bfloat16"
        r = cli("stream", str(path), "--url", f"127.0.0.1:{port}", "--wpm", "0", "--no-stats")
        assert r.returncode == 0 and len(r.stdout.splitlines()) == len(lines), r.stderr
    finally:
        proc.terminate()
        proc.wait(10)
    # the layout it ran, as `engines` auto chose it here (two engine processes on a multi-core CPU with the memory)
    from server.settings import engine_processes
    first = proc.stderr.read().splitlines()[0]
    if engine_processes(load_settings()) > 1:
        assert "2 engine processes; engines auto on a multi-core CPU: --engines 1 runs one process)" in first, first
    else:
        assert first.endswith(f"127.0.0.1:{port}/v1/stream"), first
