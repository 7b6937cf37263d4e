"""The GPU form of the step (issue 14), run on the CPU: per-stream numbers live in the pool's
slot-indexed state, one copy goes up and one comes back, nothing in between waits for the device."""
from __future__ import annotations

import pytest
import torch
from conftest import POLICIES, ROOT, random_decoder
from test_attention_variants import VARIANTS, variant_model
from torch.utils._python_dispatch import TorchDispatchMode

from models.data.synthetic import make_pairs
from models.step import StreamingDecoder
from models.translate import simulate

SENTENCES = [src for src, _ in make_pairs(10, min_len=1, max_len=9, seed=21)]
# ops that make the host wait for a GPU: a scalar read, a data-dependent shape, a boolean mask
SYNCING = {"aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::nonzero",
           "aten::masked_select", "aten::nonzero_static"}


def outputs(dec, sentences, **kw):
    return [(r.prediction, r.delays, r.token_delays) for r in simulate(dec, sentences, **kw)]


def sync_free_twin(dec) -> StreamingDecoder:
    return StreamingDecoder(dec.model, dec.tok, form="sync-free")


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("batch_size", [1, 10])
def test_sync_free_step_equals_host_step(policy, batch_size, trained_decoders):
    dec = trained_decoders[policy]
    setting = {"waitk": {"k": 2}, "gma": {"delta": 0.5}}.get(policy, {})
    want = outputs(dec, SENTENCES, batch_size=batch_size, **setting)
    assert outputs(sync_free_twin(dec), SENTENCES, batch_size=batch_size, **setting) == want


@pytest.mark.parametrize("name, policy", [("sact", "gma"), ("phrase_queryk_int", "waitk"),
                                          ("calib_gate", "gma"), ("phrase_convkv_het", "offline")])
def test_sync_free_step_equals_host_step_for_variants(name, policy, word_tok):
    _, model = variant_model(word_tok, policy, VARIANTS[name], seed=3)
    host, free = StreamingDecoder(model, word_tok, form="host"), StreamingDecoder(model, word_tok, form="sync-free")
    assert outputs(free, SENTENCES[:6], batch_size=3) == outputs(host, SENTENCES[:6], batch_size=3)


class OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name().split(".")[0]
        self.ops.append(name if "::" in name else "aten::" + name)
        if name in ("aten::index", "aten::index_put_", "aten::index_put") or func is torch.ops.aten.index.Tensor:
            for ix in (args[1] if len(args) > 1 else []) or []:
                if isinstance(ix, torch.Tensor) and ix.dtype == torch.bool:
                    self.ops.append("boolean-mask indexing")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("policy", POLICIES)
def test_a_sync_free_step_never_waits_and_copies_back_once(policy, word_tok, monkeypatch):
    dec = StreamingDecoder(random_decoder(word_tok, policy, seed=2).model, word_tok, form="sync-free")
    tolist = torch.Tensor.tolist
    copies = []
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: copies.append(t.shape) or tolist(t))
    states = [dec.new_stream() for _ in range(3)]
    for s, sentence in zip(states, SENTENCES):
        dec.push(s, sentence)
        dec.finish(s)
    decoder_steps = 0
    while not all(s.done for s in states):
        before = len(copies)
        with OpLog() as log:
            dec.step(states)
        decoder_steps += len(copies) > before
        assert not SYNCING & set(log.ops), set(log.ops) & SYNCING
        assert "boolean-mask indexing" not in log.ops
        assert len(copies) - before <= 1   # the one (B, 3) copy back
    assert decoder_steps > 3


# ---- static shapes and the compiled step ----------------------------------------------------
@pytest.mark.parametrize("policy", POLICIES)
def test_padded_batches_and_cache_lengths_change_nothing(policy, trained_decoders):
    """Static shapes pad each decoder batch with scratch-slot rows and each cache to a power of
    two: the same tokens and delays, one stream or many."""
    dec = trained_decoders[policy]
    padded = StreamingDecoder(dec.model, dec.tok, form="static")
    # the smallest power of two from 8 that holds n, at most the positions: every n up to the last bucket
    cap = dec.cfg.max_positions
    assert [padded.bucket(n) for n in range(cap + 2)] == [min(next(b for b in (2 ** e for e in range(3, 20)) if b >= n),
                                                              cap) for n in range(cap + 2)]
    assert padded.bucket(5) == 8 and padded.bucket(9) == 16 and padded.bucket(10 ** 6) == cap
    for batch_size in (1, 3, 10):
        assert outputs(padded, SENTENCES, batch_size=batch_size) == outputs(dec, SENTENCES, batch_size=batch_size)
    assert padded.pool.in_use == 1 and padded.streams_in_cache == 0   # only the scratch slot is held


@pytest.mark.parametrize("name, policy", [("sact", "waitk"), ("phrase_queryk_int", "gma"),
                                          ("calib_anneal", "gma"), ("gmm", "offline")])
def test_padded_shapes_change_nothing_for_variants(name, policy, word_tok):
    _, model = variant_model(word_tok, policy, VARIANTS[name], seed=4)
    padded = StreamingDecoder(model, word_tok, form="static")
    want = outputs(StreamingDecoder(model, word_tok), SENTENCES[:6], batch_size=3)
    assert outputs(padded, SENTENCES[:6], batch_size=3) == want


@pytest.mark.slow
def test_compiled_step_equals_eager_on_cpu(trained_decoders):
    """torch.compile (inductor, CPU) of the decoder step: the same outputs as the eager step."""
    dec = trained_decoders["gma"]
    compiled = StreamingDecoder(dec.model, dec.tok, form="compiled")
    for batch_size in (1, 4):
        assert outputs(compiled, SENTENCES[:6], batch_size=batch_size) == outputs(dec, SENTENCES[:6],
                                                                                   batch_size=batch_size)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run on a GPU machine: docs/benchmarks.md)")
@pytest.mark.parametrize("policy", POLICIES)
def test_cuda_graph_step_equals_cpu_eager(policy, trained_decoders):
    """On CUDA the compiled step (CUDA graphs) and the eager sync-free step write what the CPU writes."""
    dec = trained_decoders[policy]
    model = dec.model.to("cuda")
    try:
        eager = StreamingDecoder(model, dec.tok)
        graphs = StreamingDecoder(model, dec.tok, form="compiled")
        want = outputs(dec, SENTENCES, batch_size=10)
        assert outputs(eager, SENTENCES, batch_size=10) == want
        assert outputs(graphs, SENTENCES, batch_size=10) == want
        assert outputs(graphs, SENTENCES[:3], batch_size=1) == outputs(dec, SENTENCES[:3], batch_size=1)
    finally:
        dec.model.to("cpu")


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA (run on a GPU machine: docs/benchmarks.md)"))])
def test_server_with_the_compiled_step_streams_what_translate_writes(device, trained, trained_decoders):
    """`simulserve serve --step compiled` (here the same setting in a real uvicorn server): three
    concurrent streams (batched and padded) receive what simulate() writes for each alone. On CUDA the
    step records CUDA graphs in the engine's own thread, as the server does (the GPU check at commit 1b3c1ec:
    `bench server --step compiled` with GMA died in the capture; of test_cuda_graph_step_equals_cpu_eager,
    which records in the test's own thread, only the offline model's case had run, and passed)."""
    import asyncio

    from test_server import LiveServer, assert_matches, sentence_messages, talk
    sentences = SENTENCES[:4]
    with LiveServer(models={"gma": str(trained["gma"])}, step="compiled", device=device, warmup=device == "cuda",
                    rate_limit=10000, rate_burst=10000) as srv:
        async def main():
            return await asyncio.gather(*[
                talk(srv.url, [{"type": "start", "model": "gma", "delta": d}] + sentence_messages(sentences)
                     + [{"type": "end_stream"}], timeout=600) for d in (0.5, 1.0, 2.0)])
        results = asyncio.run(main())
    for (received, code), d in zip(results, (0.5, 1.0, 2.0)):
        assert code == 1000
        ref = [simulate(trained_decoders["gma"], [s], batch_size=1, delta=d)[0] for s in sentences]
        assert_matches(received, ref, f"delta {d}")


@pytest.mark.parametrize("policy", POLICIES)
def test_compiled_step_traces_as_one_graph(policy, trained_decoders):
    """torch.compile sees each policy's decoder step as one graph with no break (recipes/graph_breaks.py):
    a break (a .item(), a data-dependent branch) would leave eager code between compiled pieces and split the
    step into several CUDA graphs on CUDA."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("graph_breaks", ROOT / "recipes" / "graph_breaks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dec = trained_decoders[policy]
    ex = module.explain_step(dec.model, dec.tok)
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), [b.reason for b in ex.break_reasons]
    assert ex.op_count > 20
