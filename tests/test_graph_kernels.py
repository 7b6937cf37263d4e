"""What the captured graphs hold: the operators that compute in one call of the decoder's and the encoder's graph
body (models/benchmarks/operators.py `computing_operators`, recipes/graph_kernels.py). On a GPU each is a kernel
with a gap after it, so work that is the same in every layer is made once a step, not once a layer."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models.benchmarks.operators import computing_operators
from models.translate import simulate
from tests.conftest import random_decoder
from tests.test_cuda_graphs import SENTENCES, graphed

ROOT = Path(__file__).resolve().parents[1]


def test_views_are_not_counted_and_in_place_operators_are():
    x = torch.arange(12.0)
    with computing_operators(str(ROOT) + "/") as mode:
        y = x.view(3, 4).t()[1]       # three views: no kernel
        z = y + 1                     # computes
        z.add_(1)                     # in place: computes, although its output is its input
        z.clone().unsqueeze(0)        # a copy, then a view of it
    assert dict(mode.counts) == {"add": 1, "add_": 1, "clone": 1}
    assert mode.views == 4 and mode.from_python == 0
    # each counted operator is placed at the line of this file that called it
    assert sum(mode.lines.values()) == 3
    assert all(where.startswith("test_graph_kernels.py:") for _, where in mode.lines)
    with torch.inference_mode(), computing_operators(str(ROOT) + "/") as mode:   # (as a step runs)
        torch.where(x > 3, x, 0.0)    # a Python number as an argument: no tensor of it
        x[-1] = 5.0                   # a tensor made of 5.0, then copied: a copy from the host on a GPU
    assert mode.from_python == 1


def counted_run(dec, methods=("_graph_step", "_encode_core")) -> tuple[list, dict[str, list]]:
    """SENTENCES translated once (batch 4) with the decoder's graph bodies `methods` counted: the outputs
    (prediction, token delays), and per body the computing operators of each call; no call makes a tensor from a
    Python value (inside a CUDA capture: a copy from the host, which fails it)."""
    calls = {method: [] for method in methods}
    for method, modes in calls.items():
        def counted(*a, _body=getattr(dec, method), _modes=modes, _method=method, **k):
            with computing_operators(str(ROOT) + "/") as mode:
                out = _body(*a, **k)
            assert mode.from_python == 0, (_method, mode.lines)
            _modes.append(mode.counts)
            return out
        setattr(dec, method, counted)
    outputs = [(r.prediction, r.token_delays) for r in simulate(dec, SENTENCES, batch_size=4)]
    return outputs, calls


@pytest.mark.parametrize("policy", ["gma", "waitk"])
def test_layer_invariant_work_is_made_once_a_step(piece_tok, policy, one_torch_thread):
    """The decoder's and the encoder's graph bodies, in models of 1, 2 and 3 layers a side: whatever every layer
    shares (positions, masks, ~finished) does not grow with the layers, and each layer adds as many operators as
    the one before."""
    per_layers = {}
    for layers in (1, 2, 3):
        dec = graphed(random_decoder(piece_tok, policy, seed=3, encoder_layers=layers, decoder_layers=layers),
                      form="graphs-encoder")
        _, calls = counted_run(dec)
        assert all(calls.values()), {method: len(c) for method, c in calls.items()}   # (both bodies ran)
        # (a call's fewest: the cache gathered with room for the new keys; at the longest cache length there is
        # none, and the new keys are concatenated layer by layer instead)
        per_layers[layers] = {body: min(calls[method], key=lambda c: sum(c.values()))
                              for body, method in (("decoder", "_graph_step"), ("encoder", "_encode_core"))}
    for body in ("decoder", "encoder"):
        one, two, three = (per_layers[n][body] for n in (1, 2, 3))
        for op in ("arange", "cat", "bitwise_not", "ones", "zeros", "zeros_like", "floor_divide", "remainder"):
            assert one[op] == two[op] == three[op], (body, op, one[op], three[op])
        total = [sum(c.values()) for c in (one, two, three)]
        assert total[2] - total[1] == total[1] - total[0] > 0, (body, total)
    # the decoder: one window mask and (GMA) one prior per layer from one positions tensor; no per-layer zeros
    dec3 = per_layers[3]["decoder"]
    assert dec3["arange"] <= 2 and dec3["zeros_like"] == 0 and dec3["zeros"] == 0


@pytest.mark.parametrize("linears", ["cpu", "gpu"])
def test_graph_kernels_recipe_counts_both_graph_bodies(tmp_path, linears):
    src = tmp_path / "test.de"
    src.write_text("Ich habe heute keine Zeit .\nWo ist der Bahnhof ?\n")
    out = tmp_path / "kernels.json"
    r = subprocess.run([sys.executable, str(ROOT / "recipes/graph_kernels.py"), "--batch", "2", "--source", str(src),
                        "--linears", linears, "--by-line", "--json", str(out)], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    counts = json.loads(out.read_text())
    assert set(counts) == {"decoder", "encoder"}, r.stdout
    for name, c in counts.items():
        assert c["calls"] > 0 and 0 < c["min"] <= c["median"] <= c["max"], (name, r.stdout)
        assert c["from_python"] == 0, (name, r.stdout)
        # the median call's operators, line by line, add up to that call
        assert c["min"] <= sum(c["by_line"].values()) <= c["max"], name
        assert f"| {name} | {c['calls']} | {c['median']:.0f} | {c['min']} | {c['max']} |" in r.stdout, r.stdout
    # the shipped model's decoder step: three layers of attention, projections and GMA windows
    assert counts["decoder"]["median"] > counts["encoder"]["median"] > 20
    # the linears the GPU's copy runs: F.linear's products (the CPU's are oneDNN's packed ones)
    by_line = " ".join(counts["decoder"]["by_line"])
    assert ("addmm" in by_line or "linear " in by_line) == (linears == "gpu")
    assert ("_linear_pointwise" in by_line) == (linears == "cpu")


@pytest.mark.parametrize("policy", ["gma"])   # (the gather is the same for every policy)
def test_one_gather_over_every_layer_writes_what_the_per_layer_gathers_write(piece_tok, policy, one_torch_thread):
    """CUDA's cache gather (CachePool.one_gather: every layer of a kind at once, one kernel), run here on the CPU
    against the CPU's one gather a layer: the same outputs, and per graph body one gather a kind instead of one a
    layer and kind."""
    results, counts = {}, {}
    for one in (False, True):
        dec = graphed(random_decoder(piece_tok, policy, seed=4, encoder_layers=3, decoder_layers=3),
                      form="graphs-encoder")
        dec.pool.one_gather = one
        results[one], calls = counted_run(dec)
        counts[one] = {m: min(sum(c.values()) for c in modes) for m, modes in calls.items()}
    assert results[True] == results[False]
    layers = 3
    assert counts[False]["_graph_step"] - counts[True]["_graph_step"] == 4 * (layers - 1)   # dec and cross k, v
    assert counts[False]["_encode_core"] - counts[True]["_encode_core"] == 2 * (layers - 1)  # the encoder's k, v


def profiled_kernels(dec, methods=("_graph_step", "_encode_core")) -> dict[str, list[int]]:
    """SENTENCES translated (batch 4) with the kernels of each call of the graph bodies counted from the profiler
    (operators.kernels_of_bodies, what recipes/graph_kernels.py --profiler runs)."""
    from models.benchmarks.operators import kernels_of_bodies
    return kernels_of_bodies(dec, methods, lambda: simulate(dec, SENTENCES, batch_size=4))


def test_the_profilers_kernel_count_is_the_dispatch_count(piece_tok, one_torch_thread):
    """recipes/graph_kernels.py --profiler, which also counts compiled bodies (graphs-fused: tests/test_cuda_graphs.py):
    from the profiler's events an eager body's kernels are the operators the dispatch mode counts, call by call."""
    dec = random_decoder(piece_tok, "gma", seed=7)
    _, dispatched = counted_run(graphed(dec, form="graphs-encoder"))
    eager = profiled_kernels(graphed(dec, form="graphs-encoder"))
    for method, calls in dispatched.items():
        assert eager[method] == [sum(c.values()) for c in calls], method
