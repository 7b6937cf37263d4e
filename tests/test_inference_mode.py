"""The step enters torch's inference mode once per stepping loop (models/step.py `inference`): a loop already in
it (the engine thread, `simulate`, `staggered`, `advance`) pays a flag test a call, a caller outside it still
gets its steps run in inference mode, and the two write the same."""
from __future__ import annotations

import pytest
import torch
from conftest import POLICIES, random_decoder

from models.data.synthetic import make_pairs
from models.step import StreamingDecoder, inference


def drive(dec: StreamingDecoder, sentences: list[str], split: bool) -> list[tuple]:
    """Word by word through launch and collect (split) or step, the caller's inference mode left as it is."""
    states = [dec.new_stream() for _ in sentences]
    words = [s.split() for s in sentences]
    for i, s in enumerate(states):
        dec.push(s, words[i][:1])
    pos = [1] * len(states)
    for _ in range(400):
        live = [s for s in states if not s.done]
        if not live:
            break
        for i, s in enumerate(states):   # the next word of every stream that waits
            if s.blocked and not s.done:
                if pos[i] < len(words[i]):
                    dec.push(s, words[i][pos[i]:pos[i] + 1])
                    pos[i] += 1
                else:
                    dec.finish(s)
        moving = [s for s in live if not (s.done or s.blocked)]
        if moving:
            dec.collect(dec.launch(moving)) if split else dec.step(moving)
    out = [(s.target_tokens, s.token_delays) for s in states]
    for s in states:
        dec.close(s)
    return out


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("form", ["default", "graphs-encoder"])
def test_a_step_writes_the_same_inside_and_outside_inference_mode(piece_tok, policy, form, one_torch_thread):
    dec = random_decoder(piece_tok, policy, seed=13)
    dec = StreamingDecoder(dec.model, piece_tok, form=form)
    if dec.form.graphs:
        dec.capture_graphs(8, 8)
    seen = []
    real = dec._launch_decode

    def spy(*a, **k):   # the mode the decoder trial runs in
        seen.append(torch.is_inference_mode_enabled())
        return real(*a, **k)
    dec._launch_decode = spy
    sentences = [s for s, _ in make_pairs(6, seed=4)]
    outside = drive(dec, sentences, split=True)
    assert not torch.is_inference_mode_enabled()
    with torch.inference_mode():
        inside = drive(dec, sentences, split=True)
        stepped = drive(dec, sentences, split=False)
    assert outside == inside == stepped and any(tokens for tokens, _ in outside)
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
