"""The int8 step form: exact against itself (streaming = full computation, batched = single
stream, chunking), close to float32 in its decisions, and one named choice everywhere."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
import torch
from conftest import POLICIES, random_decoder
from torch import nn

from models.checkpoint import load_checkpoint
from models.int8_linear import ACT_QMAX, Int8GemvLinear, Int8Linear, int8_available, lone_rows_available, quantize_rows
from models.packed_linear import GemvLinear, PackedLinear
from models.step import StreamingDecoder
from models.step_form import FORMS, StepFormError, step_form
from models.translate import simulate
from test_streaming_equivalence import SENTENCES, assert_streams_are_the_full_computation

pytestmark = pytest.mark.skipif(not int8_available(torch.device("cpu"), torch.float32),
                                reason="no integer matrix product on this CPU build")


def int8_of(dec: StreamingDecoder) -> StreamingDecoder:
    return StreamingDecoder(dec.model, dec.tok, form="int8")


def test_int8_linear_rows_are_exact_whatever_the_batch_and_close_to_float():
    torch.manual_seed(4)
    lins = [nn.Linear(48, 80), nn.Linear(48, 16), nn.Linear(48, 8)]
    fused = Int8Linear.of(*lins)
    x = torch.randn(40, 48)
    with torch.no_grad():
        ref = torch.cat([lin(x) for lin in lins], -1)
        y = fused(x)
        for rows in (1, 2, 7, 33):   # bit for bit: a row's numbers do not depend on its batch
            assert torch.equal(fused(x[:rows]), y[:rows])
            assert torch.equal(fused(x[rows:rows + 1]), y[rows:rows + 1])
        assert torch.equal(fused(x.view(4, 10, 48)), y.view(4, 10, -1))
        # fused = the layers quantised one by one (per output channel: stacking changes nothing)
        assert torch.equal(torch.cat([Int8Linear.of(lin)(x) for lin in lins], -1), y)
        # the error of 7-bit rows and 8-bit channels: a few % of the output's scale, and not zero
        err = (y - ref).abs().max() / ref.abs().max()
        assert 1e-4 < err < 0.03, float(err)
        # a padded row of zeros stays the bias
        torch.testing.assert_close(fused(torch.zeros(1, 48)), torch.cat([lin.bias for lin in lins])[None])


def test_quantize_rows_is_symmetric_and_uses_seven_bits():
    x = torch.tensor([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0], [3.0, 1.0, -2.0]])
    scaled, scale = quantize_rows(x)
    assert torch.round(scaled).abs().amax(1).tolist() == [ACT_QMAX, 0, ACT_QMAX] and ACT_QMAX == 63
    torch.testing.assert_close(scaled * scale, x)


def test_int8_linear_is_the_explicit_integer_computation():
    """What FBGEMM computes is the scheme written out: rows rounded to 7-bit integers, times the
    int8 weights, times both scales, plus the bias."""
    torch.manual_seed(5)
    # the shipped model's shapes too: with many weights, some sit on a half step of their grid
    for n_in, n_out in ((96, 40), (1024, 256), (256, 8000)):
        lin = nn.Linear(n_in, n_out)
        q = Int8Linear.of(lin)
        x = torch.randn(9, n_in) * 3
        scaled, scale = quantize_rows(x)
        wscale = lin.weight.detach().abs().amax(1) / 127
        qweight = torch.round(lin.weight.detach() / wscale[:, None])
        assert qweight.abs().max() == 127
        ref = (torch.round(scaled) @ qweight.t()) * wscale * scale + lin.bias.detach()
        with torch.no_grad():
            torch.testing.assert_close(q(x), ref, rtol=1e-5, atol=1e-5)
            assert torch.equal(q.dequantized_weight(), qweight * wscale[:, None])


def test_int8_sums_do_not_saturate_at_the_largest_values():
    """Every activation at +63 and every weight at +127 over 1040 inputs: the largest sum the layers
    can meet. A 16-bit pair sum of 8-bit activations (255 * 127 * 2) would saturate on AVX2 without
    VNNI; 7-bit ones (127 * 127 * 2 < 32767) cannot, so the sum is exact on every CPU class."""
    q = Int8Linear(torch.ones(3, 1040), None)
    with torch.no_grad():
        y = q(torch.ones(2, 1040))
    # scale 1/63 per row, 1/127 per channel: the exact sum 63 * 127 * 1040 scaled back to 1040
    torch.testing.assert_close(y, torch.full((2, 3), 1040.0))


needs_lone = pytest.mark.skipif(not lone_rows_available(torch.device("cpu"), torch.float32),
                                reason="no FBGEMM int8 product in this torch build")


@needs_lone
def test_int8_gemv_linear_takes_a_lone_row_in_one_call_and_several_as_int8():
    """A lone row: int8's integers and scales in one FBGEMM call, so int8's numbers but for the last bits (the
    scales applied in another order); several rows: int8's, bit for bit."""
    torch.manual_seed(6)
    lins = [nn.Linear(48, 80), nn.Linear(48, 16)]
    lone, int8 = Int8GemvLinear.of(*lins), Int8Linear.of(*lins)
    x = torch.randn(200, 48) * torch.rand(200, 1) * 4
    with torch.no_grad():
        for rows in (2, 7, 40):
            assert torch.equal(lone(x[:rows]), int8(x[:rows]))
        assert torch.equal(lone(x[:40].view(4, 10, 48)), int8(x[:40].view(4, 10, 48)))
        by_row = int8(x)
        alone = torch.stack([lone(row) for row in x])
        torch.testing.assert_close(alone, by_row, rtol=1e-5, atol=1e-5 * float(by_row.abs().max()))
        assert not torch.equal(alone, by_row)   # one call: the same integers, the scales in another order
        for row in (x[0:1], x[0].view(1, 1, 48)):   # one row, whatever its leading shape
            assert lone(row).shape == row.shape[:-1] + (96,)
            torch.testing.assert_close(lone(row).reshape(-1), alone[0])
        torch.testing.assert_close(lone(torch.zeros(48)), torch.cat([lin.bias for lin in lins]))   # zeros: the bias
        no_bias = nn.Linear(48, 8, bias=False)   # the output projection's kind
        torch.testing.assert_close(Int8GemvLinear.of(no_bias)(x[3]), Int8Linear.of(no_bias)(x[3:4])[0],
                                   rtol=1e-5, atol=1e-5)


@needs_lone
def test_int8_gemv_copy_has_lone_row_paths_everywhere(word_tok):
    dec = StreamingDecoder(random_decoder(word_tok, "gma", seed=3).model, word_tok, form="int8-gemv")
    assert isinstance(dec.out_packed, Int8GemvLinear)
    for layer in dec.net.decoder:
        assert isinstance(layer.ffn.fc1, Int8GemvLinear) and isinstance(layer.self_attn.fused_qkv, Int8GemvLinear)
        # GMA's READ/WRITE rule stays in float, its lone rows by gemv
        assert all(isinstance(m, GemvLinear) for m in (layer.step_predictor.w_p, layer.step_predictor.v_p))
    assert not any(type(m) is Int8Linear for m in dec.net.modules())


@pytest.mark.parametrize("policy", POLICIES)
def test_int8_copy_keeps_the_decision_layers_in_float(policy, word_tok):
    dec = int8_of(random_decoder(word_tok, policy, seed=3))
    kinds = {type(m).__name__ for m in dec.net.modules() if isinstance(m, (Int8Linear, PackedLinear))}
    assert "Int8Linear" in kinds and isinstance(dec.out_packed, Int8Linear)
    for layer in dec.net.decoder:
        assert isinstance(layer.ffn.fc1, Int8Linear) and isinstance(layer.self_attn.fused_qkv, Int8Linear)
        if layer.step_predictor is not None:   # GMA's READ/WRITE rule reads float weights
            assert all(isinstance(m, PackedLinear) for m in (layer.step_predictor.w_p, layer.step_predictor.v_p))
    assert all(isinstance(p, nn.Parameter) and p.dtype == torch.float32 for p in dec.model.parameters())


@pytest.mark.parametrize("policy", POLICIES)
def test_int8_streaming_equals_its_own_full_computation(policy, trained_decoders):
    """Every position's rows are quantised on their own, so the int8 network run over whole
    sequences (teacher forcing) decides what the int8 stream decided, step by step."""
    dec = int8_of(trained_decoders[policy])
    _, states = simulate(dec, SENTENCES, record=True, batch_size=4)
    dec.net.logits = dec.scores   # the whole-sequence pass ends in the stream's int8 output projection
    full = SimpleNamespace(model=dec.net, cfg=dec.cfg)
    # tokens, windows and GMA's p; not the attention weights to 1e-4: the incremental encoder's states
    # differ from the whole pass's in the last float bits, and a row whose value sits on a rounding
    # boundary of its int8 grid moves by one step (attention weights then differ by ~1e-3)
    assert_streams_are_the_full_computation(dec, full, states, policy, attention=False)


@pytest.mark.parametrize("policy", POLICIES)
def test_int8_batched_and_chunked_equal_single_stream(policy, trained_decoders):
    dec = int8_of(trained_decoders[policy])
    alone = [simulate(dec, [s], batch_size=1)[0] for s in SENTENCES]
    together = simulate(dec, SENTENCES, batch_size=len(SENTENCES))
    whole = simulate(dec, SENTENCES, whole_sentence=True, batch_size=3)
    for a, b, c in zip(alone, together, whole):
        assert (a.prediction, a.delays, a.token_delays) == (b.prediction, b.delays, b.token_delays)
        assert (a.prediction, a.delays, a.token_delays) == (c.prediction, c.delays, c.token_delays)


@pytest.mark.parametrize("form, batch", [("int8", 8), pytest.param("int8-gemv", 1, marks=needs_lone)])
@pytest.mark.parametrize("policy", POLICIES)
def test_int8_decisions_stay_close_to_float32(policy, form, batch, trained_decoders):
    """The tolerance docs/benchmarks.md states for the tiny models: at least 90% of the outputs
    identical, and the mean delay within 0.25 source words (int8-gemv one stream at a time: its lone rows)."""
    from models.data.synthetic import make_pairs
    sentences = [s for s, _ in make_pairs(40, seed=21)]
    fp32 = simulate(trained_decoders[policy], sentences, batch_size=batch)
    int8 = simulate(StreamingDecoder(trained_decoders[policy].model, trained_decoders[policy].tok, form=form),
                    sentences, batch_size=batch)
    same = sum(a.prediction == b.prediction and a.delays == b.delays for a, b in zip(fp32, int8))
    assert same >= 0.9 * len(sentences), same
    mean = lambda rs: sum(sum(r.delays) / max(len(r.delays), 1) for r in rs) / len(rs)  # noqa: E731
    assert abs(mean(fp32) - mean(int8)) <= 0.25


def test_forms_are_named_choices_checked_against_the_device(word_tok):
    model = random_decoder(word_tok, "waitk").model
    assert step_form("default") is FORMS["default"]
    for gone in ("fast", "eager"):   # `eager`, once an alias of default, was removed
        with pytest.raises(StepFormError, match="one of default, host"):
            step_form(gone)
    with pytest.raises(StepFormError, match="CPU with float32"):
        StreamingDecoder(model.to(torch.bfloat16), word_tok, form="int8")
    dec = StreamingDecoder(model.float(), word_tok, form="int8")
    assert dec.form.describe() == {"name": "int8", "linears": "int8", "sync_free": False,
                                   "static_shapes": False, "compiled": False, "graphs": False, "graph_encoder": False,
                                   "summary": FORMS["int8"].summary}
    assert StreamingDecoder(model, word_tok, form="static").form.sync_free is True


def test_translate_and_evaluate_take_the_form(trained, tmp_path, capsys):
    from clients.cli import main
    src = tmp_path / "in.de"
    src.write_text("\n".join(SENTENCES[:4]) + "\n")
    assert main(["translate", "-m", str(trained["waitk"]), "-i", str(src), "-o", str(tmp_path / "a.jsonl"),
                 "--step", "int8", "--device", "cpu"]) == 0
    got = [json.loads(line)["prediction"] for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    model, tok, _ = load_checkpoint(trained["waitk"])
    assert got == [r.prediction for r in simulate(StreamingDecoder(model, tok, form="int8"), SENTENCES[:4])]
    with pytest.raises(SystemExit):
        main(["translate", "-m", str(trained["waitk"]), "-i", str(src), "--step", "int4"])
    assert "unknown step form 'int4'" in capsys.readouterr().err


def test_server_with_the_int8_form_streams_what_translate_writes(trained, trained_decoders):
    """With --step int8, /v1/models names it, and concurrent streams receive what the int8 step
    writes for each alone."""
    import httpx

    from test_server import LiveServer, assert_matches, sentence_messages, talk
    sentences = SENTENCES[:4]
    with LiveServer(models={"gma": str(trained["gma"])}, step="int8", warmup=False, rate_limit=10000,
                    rate_burst=10000) as srv:
        info = httpx.get(srv.http + "/v1/models").json()["models"][0]
        assert info["step_form"]["name"] == "int8" and info["step_form"]["linears"] == "int8"
        assert "choice" not in info["step_form"]   # asked for by name: nothing timed

        async def main():
            return await asyncio.gather(*[
                talk(srv.url, [{"type": "start", "model": "gma", "delta": d}] + sentence_messages(sentences)
                     + [{"type": "end_stream"}], timeout=120) for d in (0.5, 1.0)])
        results = asyncio.run(main())
    dec = int8_of(trained_decoders["gma"])
    for (received, code), d in zip(results, (0.5, 1.0)):
        assert code == 1000
        assert_matches(received, [simulate(dec, [s], batch_size=1, delta=d)[0] for s in sentences], f"delta {d}")


def test_server_default_is_the_form_timed_fastest_here(trained, trained_decoders):
    """The server's default, auto, times the candidate forms at start-up: /v1/models shows the timings
    and the form the rule picks from them, and a stream receives what that form writes."""
    import httpx

    from models.step_choice import pick
    from server.settings import load_settings
    from test_server import LiveServer, assert_matches, sentence_messages, talk
    assert load_settings().step == "auto"
    with LiveServer(models={"waitk": str(trained["waitk"])}, step="auto", warmup=False) as srv:
        form = httpx.get(srv.http + "/v1/models").json()["models"][0]["step_form"]
        received, code = asyncio.run(talk(srv.url, [{"type": "start", "model": "waitk", "k": 2}]
                                          + sentence_messages(SENTENCES[:2]) + [{"type": "end_stream"}]))
    timings = {f: {int(b): ms for b, ms in t.items()} for f, t in form["choice"]["ms_per_step"].items()}
    assert {"default", "int8", "gemv", "plain"} <= set(timings)
    assert form["name"] == form["choice"]["form"] == pick(timings)[0]
    assert form["choice"]["cpu"] and form["choice"]["reason"].startswith(form["name"])
    dec = StreamingDecoder(trained_decoders["waitk"].model, trained_decoders["waitk"].tok, form=form["name"])
    assert code == 1000
    assert_matches(received, [simulate(dec, [s], batch_size=1, k=2)[0] for s in SENTENCES[:2]], "auto")


@needs_lone
def test_int8_gemv_evaluated_alone_against_int8_batched(trained, tmp_path, capsys):
    """`evaluate --step int8-gemv --batch-size 1` (every decoder row a lone one) against `--step int8` in batches,
    compared by recipes/same_outputs.py as docs/benchmarks.md does: its counts are the sentences whose words or
    delays differ between the two runs' outputs."""
    import subprocess
    import sys
    from pathlib import Path

    from clients.cli import main
    from models.data.synthetic import make_pairs
    pairs = make_pairs(24, seed=41)
    src, ref = tmp_path / "s.de", tmp_path / "s.en"
    src.write_text("".join(s + "\n" for s, _ in pairs))
    ref.write_text("".join(t + "\n" for _, t in pairs))
    runs = {}
    for form, batch in (("int8", 8), ("int8-gemv", 1)):
        runs[form] = tmp_path / form
        assert main(["evaluate", "-m", str(trained["gma"]), "--source", str(src), "--reference", str(ref),
                     "--batch-size", str(batch), "--step", form, "--device", "cpu", "--quiet",
                     "-o", str(runs[form])]) == 0
    capsys.readouterr()
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "recipes/same_outputs.py", str(runs["int8"]), str(runs["int8-gemv"])],
                       cwd=root, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [line.split(" | ") for line in r.stdout.splitlines() if line.startswith("| s | ")]
    assert len(rows) == 1, r.stdout
    out = {f: [json.loads(line) for line in next((runs[f] / "outputs" / "s").glob("*.jsonl")).read_text().splitlines()]
           for f in runs}
    differ = sum(a["prediction"] != b["prediction"] for a, b in zip(out["int8"], out["int8-gemv"]))
    assert rows[0][2:4] == ["24", str(differ)], r.stdout
    assert f"{differ} of 24 sentences translated differently" in r.stdout
    (runs["int8-gemv"] / "outputs" / "s").rename(runs["int8-gemv"] / "outputs" / "t")   # nothing in common
    r = subprocess.run([sys.executable, "recipes/same_outputs.py", str(runs["int8"]), str(runs["int8-gemv"])],
                       cwd=root, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "no outputs in common" in r.stderr
