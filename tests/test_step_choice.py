"""`--step auto`: the choice rule on injected timings, the measurement and its cache on a tiny model,
and what the server and the benchmarks say about the choice."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import random_decoder

from models import step_choice
from models.cpu_info import cpu_summary, describe, extensions
from models.step import StreamingDecoder
from models.step_choice import StepChoice, choose, pick


def test_the_fastest_form_is_chosen_on_injected_timings():
    form, why = pick({"default": {1: 4.2, 16: 7.0}, "int8": {1: 2.0, 16: 3.0}, "plain": {1: 3.9, 16: 6.9},
                      "gemv": {1: 3.0, 16: 6.0}})
    # the runners-up follow, fastest first, with their own mean ratios: gemv (3/4.2 + 6/7) / 2, plain (...) / 2
    assert form == "int8" and why == ("int8: 0.45x the time of default (mean over batches 1, 16); "
                                      "then gemv 0.79x, plain 0.96x")


def test_a_form_slower_than_float32_at_any_batch_is_never_chosen():
    # the AVX2-without-VNNI case: int8 faster alone, 4x slower at batch 16
    timings = {"default": {1: 4.2, 16: 7.0}, "int8": {1: 3.0, 16: 28.9}}
    form, why = pick(timings)
    assert form == "default" and "never chosen: int8" in why
    # and when every other form is slower everywhere, float32 stays
    assert pick({"default": {1: 1.0}, "int8": {1: 1.5}, "plain": {1: 1.01}})[0] == "default"


def test_a_tie_keeps_float32():
    assert pick({"default": {1: 2.0, 16: 3.0}, "int8": {1: 2.0, 16: 3.0}})[0] == "default"


def test_the_cpu_line_names_the_vector_extensions():
    ext = extensions({"avx2", "fma"})
    assert ext == {"avx2": True, "avx512": False, "vnni": False, "amx": False}
    assert describe("AMD EPYC", 2, ext, {}) == "AMD EPYC, 2 cores, AVX2 (no VNNI)"
    full = extensions({"avx2", "avx512f", "avx512_vnni", "amx_int8"})
    assert describe("Xeon", 8, full, {"ONEDNN_MAX_CPU_ISA": "AVX2"}) == \
        "Xeon, 8 cores, AVX2 + AVX-512 + VNNI + AMX; capped by ONEDNN_MAX_CPU_ISA=AVX2"
    here = cpu_summary()
    assert here["cores"] >= 1 and here["line"].startswith(here["model"])


def test_auto_times_the_candidates_and_caches_the_choice(word_tok, tmp_path, monkeypatch):
    monkeypatch.setenv("SIMULSERVE_CACHE_DIR", str(tmp_path))
    model = random_decoder(word_tok, "gma", seed=2).model
    calls = []
    real = step_choice.measure
    monkeypatch.setattr(step_choice, "measure", lambda *a, **k: calls.append(1) or real(*a, **k, rounds=1))
    dec = StreamingDecoder(model, word_tok, form="auto")
    c = dec.choice
    assert calls == [1] and not c.cached
    assert set(c.ms_per_step) == set(step_choice.candidates(torch.device("cpu"), torch.float32))
    assert all(ms > 0 for t in c.ms_per_step.values() for ms in t.values())
    assert c.form == pick(c.ms_per_step)[0] == dec.form.name    # the decoder runs what was chosen
    assert dec.describe_form()["choice"]["form"] == c.form
    # a second decoder on this machine reads the cache: no timing, same choice
    again = StreamingDecoder(model, word_tok, form="auto").choice
    assert calls == [1] and again.cached and again.form == c.form and again.ms_per_step == c.ms_per_step
    # another machine (here: another thread count) times again
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert not StreamingDecoder(model, word_tok, form="auto").choice.cached and calls == [1, 1]
    finally:
        torch.set_num_threads(threads)
    assert len(json.loads((tmp_path / "step_forms.json").read_text())) == 2


def test_one_candidate_needs_no_timing(word_tok, monkeypatch):
    monkeypatch.setattr(step_choice, "measure", lambda *a, **k: pytest.fail("timed"))
    monkeypatch.setattr(step_choice, "candidates", lambda device, dtype: ["default"])
    model = random_decoder(word_tok, "waitk", seed=1).model
    c = choose(model, word_tok)
    assert isinstance(c, StepChoice) and c.form == "default" and "only candidate" in c.reason


def test_int8_and_gemv_are_candidates_only_where_they_run(word_tok):
    from models.step_form import FORMS, StepFormError
    assert step_choice.candidates(torch.device("cpu"), torch.float32) == ["default", "int8", "int8-gemv", "gemv",
                                                                          "plain"]
    assert step_choice.candidates(torch.device("cpu"), torch.bfloat16) == ["default", "plain"]
    with pytest.raises(StepFormError, match="'gemv' runs on the CPU in float32 only"):
        FORMS["gemv"].resolve(torch.device("cpu"), torch.bfloat16)
    with pytest.raises(StepFormError, match="'int8-gemv' runs on the CPU with float32 weights only"):
        FORMS["int8-gemv"].resolve(torch.device("cpu"), torch.bfloat16)


def test_auto_does_not_resolve_without_a_decoder():
    from models.step_form import FORMS, StepFormError
    with pytest.raises(StepFormError, match="chosen by measurement"):
        FORMS["auto"].resolve(torch.device("cpu"), torch.float32)


def test_auto_on_a_gpu_is_the_graphs_encoder_form_where_it_was_tested():
    """No timing on a GPU: graphs-encoder (CUDA, float32, no per-row bans), else the sync-free default."""
    from models.decoding import DecodingOptions
    from models.step_choice import gpu_form
    cuda = torch.device("cuda")
    assert gpu_form(cuda, torch.float32)[0] == "graphs-encoder"
    assert gpu_form(cuda, torch.float32, DecodingOptions())[0] == "graphs-encoder"
    assert gpu_form(cuda, torch.bfloat16)[0] == "default"
    form, why = gpu_form(cuda, torch.float32, DecodingOptions(no_repeat_ngram=3))
    assert form == "default" and "host" in why
    assert gpu_form(cuda, torch.float32, DecodingOptions(no_stutter=2))[0] == "default"
    assert gpu_form(torch.device("mps"), torch.float32)[0] == "default"
