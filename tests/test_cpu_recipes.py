"""recipes/tail_steps.py and recipes/linear_rows.py, run as a user runs them: a lone stream's word and tail steps
per form (the float32 forms write the same tokens), and a product's time by rows four ways (int8's layer among them)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models.int8_linear import int8_available, lone_rows_available
from models.packed_linear import packing_available

ROOT = Path(__file__).resolve().parents[1]
LINES = ["Ich habe heute keine Zeit .", "Wo ist der Bahnhof ?", "Das Wetter ist schön und warm .",
         "Kannst du mir bitte helfen ?"]
needs_packing = pytest.mark.skipif(not packing_available(torch.device("cpu"), torch.float32),
                                   reason="oneDNN packed linears are not available in this torch build")


def run(*args: str) -> str:
    r = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@needs_packing
@pytest.mark.parametrize("batch", [1, 2])
def test_tail_steps_splits_word_and_tail_steps_and_float32_forms_agree(tmp_path, batch):
    src = tmp_path / "unseen.de"
    src.write_text("\n".join(LINES) + "\n")
    out = run("recipes/tail_steps.py", "--source", str(src), "--forms", "default,gemv,plain",
              "--batch", str(batch))
    rows = {}
    for line in out.splitlines():
        m = re.match(r"\| (\w+) \| (\d+) \| ([\d.]+) \| (\d+) \| ([\d.]+) \| ([\d.]+) / (\d+) / (\d+) / (\d+) \| "
                     r"(\d+) / (\d+) / (\d+) / (\d+) \| (\w{8}) \|$", line)
        if m:
            rows[m.group(1)] = m.groups()[1:]
    assert set(rows) == {"default", "gemv", "plain"}, out
    for form, (words, word_ms, tails, tail_ms, *after, digest) in rows.items():
        assert int(words) > 0 and int(tails) > 0 and float(word_ms) > 0 and float(tail_ms) > 0, out
        mean, p90, p99, top, mean_ms, *ms = (float(a) for a in after)   # steps and ms after each last word
        assert p90 <= p99 <= top and mean <= top and ms == sorted(ms) and mean_ms <= ms[-1], out
        # every tail step comes after a stream's last word, and so do the steps that write before the end is known
        assert mean * len(LINES) >= int(tails), out
        if batch == 1:   # one stream a step: its steps after its last word take at least its tail steps' time
            assert (mean_ms + 0.5) * len(LINES) >= int(tails) * (float(tail_ms) - 0.005), out
    assert len({r[-1] for r in rows.values()}) == 1, f"float32 forms wrote different tokens:\n{out}"


@needs_packing
def test_linear_rows_times_each_shape_four_ways():
    out = run("recipes/linear_rows.py", "--rows", "1,4", "--calls", "3")
    rows = re.findall(r"^\| (\d+) \| (\d+)x(\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+|–) \| (\d+|–) \| (\d+|–) "
                      r"\| (oneDNN packed|F\.linear|addmm|int8|int8-gemv) \|$", out, re.M)
    assert [(int(r[0]), int(r[1]), int(r[2])) for r in rows] == [
        (n, i, o) for n in (1, 4) for i, o in ((256, 768), (256, 1024), (1024, 256), (256, 8000))], out
    int8 = int8_available(torch.device("cpu"), torch.float32)
    lone = lone_rows_available(torch.device("cpu"), torch.float32)
    for *_, packed, linear, addmm, layer, product, gemv_layer, fastest in rows:
        us = {"oneDNN packed": int(packed), "F.linear": int(linear), "addmm": int(addmm)}
        assert (layer != "–") == int8 and (product != "–") == int8 and (gemv_layer != "–") == lone, out
        if int8:
            us["int8"] = int(layer)
        if lone:
            us["int8-gemv"] = int(gemv_layer)
        assert us[fastest] == min(us.values()), out
