"""The `graphs` step form: the decoder and encoder steps captured once at start-up for fixed shapes
(models/cuda_graphs.py).

On the CPU the same fixed shapes, pool and buffers run eagerly: these tests hold that plumbing to the plain
step and check the capture rules. With CUDA the graphs are replayed and held to eager CUDA and to the CPU
(skipped without a GPU; recipes/gpu/check.sh runs them)."""
from __future__ import annotations

import time

import httpx
import pytest
import torch

from models.cache_pool import PoolFull
from models.cuda_graphs import GraphShapeError
from models.decoding import DecodingOptions
from models.step import StreamingDecoder
from models.step_form import StepFormError
from models.translate import simulate
from server.bench import capture_line
from tests.conftest import POLICIES, random_decoder
from tests.test_server import LiveServer, sentence_messages, talk

SENTENCES = ["a b c d e f g", "b c d e f g h i j", "c d e", "a", "d d e f a b c g h", "e f", "g a b c d e"]

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def outputs(results):
    return [(r.prediction, r.token_delays) for r in results]


def graphed(dec: StreamingDecoder, capacity: int = 16, max_batch: int = 8, device=None,
            form: str = "graphs", widths: list[int] | None = None) -> StreamingDecoder:
    g = StreamingDecoder(dec.model.to(device) if device else dec.model, dec.tok, form=form)
    g.capture_graphs(capacity, max_batch, widths)
    return g


@pytest.mark.parametrize("form", ["graphs", "graphs-encoder"])
@pytest.mark.parametrize("policy", POLICIES)
def test_graphs_form_writes_what_the_default_form_writes(piece_tok, policy, form, one_torch_thread):
    dec = random_decoder(piece_tok, policy, seed=7)
    g = graphed(dec, form=form)
    assert g.pool.fixed and g.graphs.sealed
    for batch in (1, 3, 8):   # padded to 1, 4 and 8 rows
        assert outputs(simulate(g, SENTENCES, batch_size=batch)) == outputs(simulate(dec, SENTENCES, batch_size=batch))
    assert g.graphs.replays > 0   # the steps went through the captured shapes, not around them
    # the encoder's chunk step went through its captured shapes in graphs-encoder (a causal encoder) only
    assert (g.graphs.encoder_replays > 0) == (form == "graphs-encoder" and g.cfg.causal_encoder)
    # a whole sentence at once: a captured width up to 64 subwords (a chat message, a flooding client)
    whole = outputs(simulate(dec, SENTENCES, batch_size=4, whole_sentence=True))
    before = g.graphs.encoder_replays
    assert outputs(simulate(g, SENTENCES, batch_size=4, whole_sentence=True)) == whole
    assert g.streams_in_cache == 0
    if form == "graphs-encoder" and g.cfg.causal_encoder:
        assert g.graphs.encoder_replays > before
        assert g.graphs.encoder_shape(3, 9, 0)[:2] == (4, 16) and g.graphs.encoder_shape(3, 65, 0) is None
    # chunks wider than the captured widths run eagerly on the same fixed pool
    narrow = graphed(dec, form=form, widths=[1, 2])
    assert outputs(simulate(narrow, SENTENCES, batch_size=4, whole_sentence=True)) == whole
    assert narrow.streams_in_cache == 0


@pytest.mark.slow
def test_fused_form_compiles_the_decoder_step_and_writes_what_the_default_form_writes(piece_tok, one_torch_thread):
    """graphs-fused: the decoder step and the encoder's chunk step compiled by inductor (its default mode: no CUDA
    graphs of its own, ours capture them) inside the same fixed shapes, over a copy whose projections are one
    product per input; GMA, whose step has the most elementwise work, batched and alone."""
    import torch._inductor.config

    from models.packed_linear import FusedLinear
    from tests.test_graph_kernels import profiled_kernels
    dec = random_decoder(piece_tok, "gma", seed=7)
    # (compiled once, with a profiler event per generated kernel for the count below: the flag is read when a
    # kernel is generated, and changes no value)
    with torch._inductor.config.patch({"cpp.enable_kernel_profile": True}):
        torch._dynamo.reset()
        g = graphed(dec, form="graphs-fused")
        assert g.compiled and g.form.graphs and g.decode_fn is not g.net.decode_step
        assert g.cfg.causal_encoder and g.encode_chunk_fn is not g.net.encode_chunk
        assert g.net is not dec.model and isinstance(g.net.fused_cross_kv, FusedLinear)
        for batch in (1, 8):
            assert outputs(simulate(g, SENTENCES, batch_size=batch)) == outputs(simulate(dec, SENTENCES,
                                                                                         batch_size=batch))
        assert g.graphs.replays > 0 and g.graphs.encoder_replays > 0
        fused = profiled_kernels(g)
    # each graph body holds fewer kernels than graphs-encoder's eager one (inductor's generated kernels and the
    # library calls around them, counted from the profiler: recipes/graph_kernels.py --profiler)
    eager = profiled_kernels(graphed(dec, form="graphs-encoder"))
    for body, calls in eager.items():
        assert len(fused[body]) == len(calls) > 0
        assert 0 < max(fused[body]) < min(calls), (body, fused[body], calls)


@pytest.mark.slow
def test_fused_form_compiles_every_captured_shape_within_dynamos_recompile_limit(piece_tok, one_torch_thread):
    """A CUDA capture warms up every (batch, cache length[, width]) body before recording it, so graphs-fused compiles
    every variant dynamo needs at start-up: batch 1 and wider, chunk width 1 and wider, caches with and without room.
    Past dynamo's recompile limit (8 by default) it would run the rest eagerly and capture unfused kernels without a
    word; capture makes that an error, and the form raises the limit. The same warm-ups, in the same order, here."""
    dec = random_decoder(piece_tok, "gma", seed=7)
    g = graphed(dec, capacity=16, max_batch=4, form="graphs-fused", widths=[1, 2, 8])
    torch._dynamo.reset()
    from models.benchmarks.compile_variants import warm_captured_shapes
    out = warm_captured_shapes(g)   # (recipes/compile_variants.py's count)
    assert out["failed"] is None and out["shapes"] == len(g.graphs.entries), out
    variants = out["variants"]
    # batch 1 and wider, width 1 and wider, with and without room: each step compiled more than once, and with room to
    # spare under the form's limit (no sizes shared by chance: duck shapes off)
    assert 1 < variants["decode_step"] <= 4 and 1 < variants["encode_chunk"] <= 8 and 1 < variants["_settle"] <= 4, \
        variants
    assert torch._dynamo.config.recompile_limit >= 2 * variants["encode_chunk"]
    # under a limit the shapes need more than, the warm-ups stop with dynamo's error (a capture's start-up fails)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=1):
        stopped = warm_captured_shapes(g)
    assert "RecompileLimit" in stopped["failed"] and 0 < stopped["shapes"] < len(g.graphs.entries), stopped


@pytest.mark.parametrize("policy", POLICIES)
def test_rows_changed_by_the_host_are_written_inside_the_graph(piece_tok, policy, one_torch_thread):
    """Streams out of phase, as in a server (nearly every step has streams that start or read): the decoder's
    graph writes the rows the host changed itself, so around it only the input copies and the read-back run one
    by one (a GPU's launches); the translations are the default form's, and the scratch slot's row, which the
    padding rewrites, keeps its values."""
    from torch.profiler import ProfilerActivity, profile

    from models.benchmarks.operators import operators_outside
    from models.benchmarks.staggered import staggered
    from models.cuda_graphs import REPLAYED
    dec = random_decoder(piece_tok, policy, seed=5)
    g = graphed(dec, capacity=12, max_batch=8, form="graphs-encoder")
    rows = g.pool.rows
    scratch_row = {name: t[g.scratch].clone() for name, t in rows.tensors().items()}
    launched = []
    decode = g._launch_decode

    def counted(*a, **k):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out = decode(*a, **k)
        launched.append(operators_outside(prof.profiler.kineto_results.events(), REPLAYED))
        return out
    g._launch_decode = counted
    lines = SENTENCES * 2
    got = [(r.prediction, r.token_delays) for r in staggered(g, lines, streams=5, gap=3)]
    assert got == outputs(simulate(dec, lines, batch_size=1))
    assert g.graphs.replays == len(launched) > 0 and g.streams_in_cache == 0
    # nothing runs around the decoder's graph: its slots, changed rows and new streams' rows were uploaded into its
    # own inputs (the decisions are read back later: collect). (Before: every field of a new stream's row reset and
    # each changed row written, one operator each, up to 17 a step; then up to 6 copies into the graph's inputs)
    assert max(launched) == 0, launched
    assert g.graphs.copies == 0 and (g.graphs.encoder_replays > 0) == g.cfg.causal_encoder
    # every graph reads its inputs from the one input buffer, where the step's upload lands
    buffer = g.graphs.inputs.buffer
    lo, hi = buffer.data_ptr(), buffer.data_ptr() + buffer.numel() * buffer.element_size()
    for key, (_, static, _) in g.graphs.entries.items():
        assert len(static) == (2 if key[0] == "enc" else 3)
        assert all(lo <= x.data_ptr() and x.data_ptr() + x.numel() * x.element_size() <= hi for x in static), key
    for name, t in rows.tensors().items():
        assert torch.equal(t[g.scratch], scratch_row[name]), name


def test_encoder_padding_writes_only_the_scratch_slot(piece_tok, one_torch_thread):
    """A captured encoder step pads its rows with the scratch slot and its width past each row's new subwords;
    none of that lands where a stream reads: another stream's slot and a stream's own positions past what it
    received stay untouched."""
    g = graphed(random_decoder(piece_tok, "gma", seed=3), capacity=6, max_batch=4, form="graphs-encoder")
    a, idle = g.new_stream(), g.new_stream()
    g.push(a, "a b".split())
    g.advance([a])
    assert g.graphs.encoder_replays > 0 and a.n_encoded == a.available > 0
    for kind in ("enc_k", "enc_v", "cross_k", "cross_v"):
        cache = g.pool.tensors[kind]
        assert cache[:, a.slot, :, : a.available].abs().sum() > 0
        assert cache[:, a.slot, :, a.available:].abs().sum() == 0
        assert cache[:, idle.slot].abs().sum() == 0


def test_capture_happens_once_before_any_stream(word_tok):
    dec = random_decoder(word_tok, "gma", seed=1)
    with pytest.raises(StepFormError, match="captures no graphs"):
        dec.capture_graphs(4, 4)
    g = StreamingDecoder(dec.model, word_tok, form="graphs")
    s = g.new_stream()
    with pytest.raises(StepFormError, match="before any stream"):
        g.capture_graphs(4, 4)
    g.close(s)
    g.capture_graphs(4, 4)
    with pytest.raises(StepFormError, match="captured already"):
        g.capture_graphs(4, 4)
    banning = StreamingDecoder(dec.model, word_tok, form="graphs", options=DecodingOptions(no_repeat_ngram=2))
    with pytest.raises(StepFormError, match="no_repeat_ngram"):
        banning.capture_graphs(4, 4)


def test_shapes_beyond_the_capture_are_a_clear_error_and_the_pool_is_fixed(word_tok):
    g = graphed(random_decoder(word_tok, "waitk", seed=2), capacity=6, max_batch=2)
    states = [g.new_stream(k=1) for _ in range(3)]
    for s in states:
        g.push(s, "a b c".split())
    with pytest.raises(GraphShapeError, match="no graph for a batch of 4 rows"):
        g.advance(states)   # (the first step READs without the decoder; the next one decodes)
    for _ in range(3):
        g.new_stream()
    with pytest.raises(PoolFull):   # 6 streams hold every slot but the scratch one
        g.new_stream()
    assert g.pool.shrink() == 0 and g.pool.capacity == 7


@pytest.mark.parametrize("form", ["graphs", "graphs-encoder"])
def test_server_captures_before_ready_and_streams_the_same(trained, form, one_torch_thread):
    """A real server with --step graphs (or graphs-encoder): /v1/models reports the capture, and a stream writes
    what the default form writes for the same sentences."""
    from tests.conftest import decoder_from
    reference = outputs(simulate(decoder_from(trained["gma"]), SENTENCES))
    with LiveServer(models={"gma": str(trained["gma"])}, step=form, max_streams=8, max_batch=4,
                    rate_limit=10000, rate_burst=10000) as srv:
        info = httpx.get(srv.http + "/v1/models").json()["models"][0]
        assert info["step_form"]["graphs"] and info["graphs"]["batch_sizes"] == [1, 2, 4]
        captured = info["graphs"]
        # replayed as CUDA graphs where the server runs on a GPU, the same fixed shapes run eagerly elsewhere
        assert captured["replayed"] == torch.cuda.is_available()
        kind = "CUDA graphs" if torch.cuda.is_available() else "fixed shapes (eager)"
        assert capture_line(captured).startswith(f"captured at start-up: {captured['graphs']} {kind}, "
                                                 f"{captured['encoder_graphs']} of them the encoder's, in ")
        # a decoder graph per (batch, length), an encoder graph per (batch, chunk width, length)
        assert captured["encoder_graphs"] == 3 * len(captured["widths"]) * len(captured["lengths"])
        assert (captured["encoder_graphs"] > 0) == (form == "graphs-encoder")
        assert captured["graphs"] == 3 * len(captured["lengths"]) + captured["encoder_graphs"]
        import asyncio
        msgs = [{"type": "start", "model": "gma"}] + sentence_messages(SENTENCES) + [{"type": "end_stream"}]
        received, code = asyncio.run(talk(srv.url, msgs))
    assert code == 1000
    got = [m["translation"] for m in received if m["type"] == "sentence"]
    assert got == [p for p, _ in reference]


@cuda
@pytest.mark.parametrize("form", ["graphs", "graphs-encoder", "graphs-fused"])
@pytest.mark.parametrize("policy", POLICIES)
def test_cuda_graph_replay_equals_eager_and_cpu(piece_tok, policy, form):
    """Graph replay = eager CUDA = CPU, batched = single stream; capture takes seconds, not minutes."""
    cpu = random_decoder(piece_tok, policy, seed=7)
    want = outputs(simulate(cpu, SENTENCES, batch_size=1))
    assert outputs(simulate(cpu, SENTENCES, batch_size=8)) == want
    model = cpu.model.to("cuda")
    eager = StreamingDecoder(model, piece_tok, form="sync-free")
    t0 = time.perf_counter()
    g = StreamingDecoder(model, piece_tok, form=form)
    stats = g.capture_graphs(16, 8)
    took = time.perf_counter() - t0
    assert stats["replayed"]
    for batch in (1, 8):
        assert outputs(simulate(eager, SENTENCES, batch_size=batch)) == want
        assert outputs(simulate(g, SENTENCES, batch_size=batch)) == want
    assert g.graphs.replays > 0
    assert (g.graphs.encoder_replays > 0) == (g.form.graph_encoder and g.cfg.causal_encoder)
    # whole sentences at once: the wide captured widths (16-64 subwords) replayed against the CPU
    assert (outputs(simulate(g, SENTENCES, batch_size=4, whole_sentence=True))
            == outputs(simulate(cpu, SENTENCES, batch_size=4, whole_sentence=True)))
    # (last, so that a slow capture still reports its outputs: graphs-fused compiles its three functions while it
    # captures, inductor's minute, not the compiled form's many)
    assert took < (180 if form == "graphs-fused" else 60), f"capture took {took:.0f} s"


@cuda
@pytest.mark.parametrize("policy", POLICIES)
def test_cuda_graph_replay_equals_cpu_out_of_phase_and_overlapped(piece_tok, policy):
    """On a GPU, steps whose inputs are uploaded while an earlier step is still queued: streams out of phase (new
    and changed rows nearly every step, the padding placed around them) and two launches in flight at once (the
    server's overlap: a staging copy or a read-back buffer reused too early would mix the two steps' values).
    Both write what the CPU writes; each graphed step sent its inputs with one copy and no replay copied any."""
    from models.benchmarks.staggered import staggered
    from tests.test_overlap import run_two_groups
    cpu = random_decoder(piece_tok, policy, seed=5)
    lines = SENTENCES * 2
    want = outputs(simulate(cpu, lines, batch_size=1))
    g = StreamingDecoder(cpu.model.to("cuda"), piece_tok, form="graphs-encoder")
    g.capture_graphs(16, 8)
    assert outputs(staggered(g, lines, streams=5, gap=3)) == want
    assert g.graphs.copies == 0 and g.graphs.inputs.copies == g.graphs.replays > 0
    plain = random_decoder(piece_tok, policy, seed=5)
    assert run_two_groups(g, SENTENCES, interleave=True) == run_two_groups(plain, SENTENCES, interleave=False)
    assert g.graphs.copies == 0 and len(g.readback._free) <= 3
