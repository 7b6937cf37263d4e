"""The step enters torch's inference mode once per stepping loop (models/step.py `inference`): a loop already in
it (the engine thread, `simulate`, `staggered`, `advance`) pays a flag test a call, a caller outside it still
gets its steps run in inference mode, and the two write the same."""
from __future__ import annotations

import pytest
import torch
from conftest import POLICIES, random_decoder
from test_overlap import run_two_groups
from test_streaming_equivalence import SENTENCES

from models.step import StreamingDecoder, inference


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("form", ["default", "graphs-encoder"])
def test_a_step_writes_the_same_inside_and_outside_inference_mode(piece_tok, policy, form, one_torch_thread):
    """Launched and collected (two groups in flight at once) and stepped, from outside the mode and inside it."""
    plain = random_decoder(piece_tok, policy, seed=13)
    dec = StreamingDecoder(plain.model, piece_tok, form=form)
    if dec.form.graphs:
        dec.capture_graphs(capacity=12, max_batch=8)
    seen = []
    real = dec._launch_decode

    def spy(*a, **k):   # the mode the decoder trial runs in
        seen.append(torch.is_inference_mode_enabled())
        return real(*a, **k)
    dec._launch_decode = spy
    outside = run_two_groups(dec, SENTENCES, interleave=True)
    assert not torch.is_inference_mode_enabled()
    with torch.inference_mode():
        inside = run_two_groups(dec, SENTENCES, interleave=True)
        stepped = run_two_groups(dec, SENTENCES, interleave=False)
    assert outside == inside == stepped and any(tokens for tokens, _, _ in outside)
    assert seen and all(seen)   # entered by launch itself where the caller was outside it


def test_inference_enters_the_mode_only_where_it_is_off():
    calls = []

    @inference
    def probe(x):
        calls.append(torch.is_inference_mode_enabled())
        return x * 2

    t = torch.ones(2, requires_grad=True)
    out = probe(t)
    assert calls == [True] and not out.requires_grad and torch.is_inference(out)
    assert not torch.is_inference_mode_enabled()   # left again
    with torch.inference_mode():
        assert torch.is_inference(probe(torch.ones(2)))
    with pytest.raises(ZeroDivisionError):          # an error leaves the mode too
        inference(lambda: 1 / 0)()
    assert not torch.is_inference_mode_enabled()
