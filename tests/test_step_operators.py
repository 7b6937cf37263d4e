"""recipes/step_operators.py, run as a user runs it: operators per call of the encoder's and the decoder's half
and per whole step, and of those what a GPU would launch one by one around its graphs (the `graphs` forms run
their graphs eagerly on the CPU, inside a marked profiler region)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINES = ["Ich habe heute keine Zeit .", "Wo ist der Bahnhof ?", "Das Wetter ist schön und warm .",
         "Kannst du mir bitte helfen ?"]


def table(stdout: str) -> dict[str, list[int]]:
    rows = {}
    for line in stdout.splitlines():
        m = re.match(r"\| (encoder|decoder|whole step) \| (\d+) \| ([\d |]+)\|$", line)
        if m:
            rows[m.group(1)] = [int(m.group(2))] + [int(x) for x in m.group(3).split("|")]
    return rows


@pytest.mark.parametrize("form", ["default", "graphs-encoder"])
def test_step_operators_counts_what_runs_outside_the_graphs(tmp_path, form):
    src = tmp_path / "unseen.de"
    src.write_text("\n".join(LINES) + "\n")
    r = subprocess.run([sys.executable, str(ROOT / "recipes/step_operators.py"), "--form", form, "--sentences", "4",
                        "--arrivals", "staggered", "--source", str(src)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = table(r.stdout)
    assert set(rows) == {"encoder", "decoder", "whole step"}, r.stdout
    for name, (calls, median, low, high, out_median, out_low, out_high) in rows.items():
        assert calls > 0 and 0 < low <= median <= high, (name, r.stdout)
        if form == "default":   # no graphs: everything is launched one by one
            assert (out_median, out_low, out_high) == (median, low, high)
        else:                   # the graphs hold nearly all of it: the input copies and the read-back stay
            assert out_high <= 6 if name != "whole step" else out_high < low / 10, (name, r.stdout)
    # the whole step holds both halves (and the planning and upload around them)
    assert rows["whole step"][1] >= rows["decoder"][1]
