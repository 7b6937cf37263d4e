"""`simulserve bench abuse` end to end (the real CLI, its own server): honest streams keep their exact words."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.mark.slow
def test_bench_abuse_keeps_honest_streams_exact(trained, tmp_path):
    out = tmp_path / "abuse.json"
    cmd = [sys.executable, "-m", "clients.cli", "bench", "abuse", "--checkpoint", str(trained["waitk"]),
           "--honest", "2", "--sentences", "3", "--rounds", "1", "--settle", "2", "--soak-streams", "10",
           "--memory-trim-s", "1", "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    figures = json.loads(out.read_text())
    honest = figures["honest"]
    # the 2 x 3 sentences were run again and again for the whole attack: every run is compared
    assert honest["sentences"] >= 6 and honest["sentences"] % 6 == 0
    assert honest["identical"] == honest["completed"] == honest["sentences"]
    assert honest["lost"] == honest["duplicated"] == honest["seq_gaps"] == honest["honest_errors"] == 0
    assert figures["health"]["failures"] == 0 and figures["health"]["polls"] > 10
    seen, refused = figures["attackers_saw"], figures["server_refusals"]
    for expected in ("never starts start_timeout", "never starts too_many_connections",
                     "wrong key too_many_auth_failures", "junk keep-alive idle_timeout", "bad UTF-8 close 1007",
                     "non-reader dropped by the server", "surrogates bad_message"):
        assert seen.get(expected), (expected, seen)
    for reason, n in (("header_too_large", 5), ("too_many_headers", 3), ("head_timeout", 45),
                      ("ping_flood", 1), ("start_timeout", 64), ("ip_connections", 16)):
        assert refused.get(reason, 0) >= n, (reason, refused)
    assert figures["cache_soak"]["slots_after"] < figures["cache_soak"]["slots_peak"]
    assert "lost 0, duplicated 0" in run.stdout
