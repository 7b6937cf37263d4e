"""The policy objects: the example policy of docs/architecture.md runs through the one decoding loop, and
the built-in policies' rules hold without the step asking which policy it runs."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from models.policies import POLICIES, Gma, Offline, PolicyError, WaitK, make_policy, policy_class, policy_named
from models.translate import simulate
from tests.conftest import random_decoder, tiny_config

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = ["a b c d e f g", "b c d e f g h i j", "c d e", "a"]


def example_policy():
    """The ten-line policy shown in docs/architecture.md, executed from the page itself."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    code = re.search(r"```python\n(.*?class WaitKWithHead.*?)```", text, re.S).group(1)
    assert len(code.strip().splitlines()) <= 12
    scope: dict = {}
    exec(compile(code, "docs/architecture.md", "exec"), scope)
    return scope["WaitKWithHead"]


def run(dec, sentences, policy):
    out = []
    for sentence in sentences:
        s = dec.new_stream(policy=policy)
        dec.push(s, sentence.split())
        dec.finish(s)
        dec.advance([s])
        out.append((s.target_tokens, s.token_delays))
        dec.close(s)
    return out


@pytest.mark.parametrize("head", [1, 4, 6])
def test_example_policy_runs_and_only_delays_wait_k(word_tok, head):
    WaitKWithHead = example_policy()
    dec = random_decoder(word_tok, "waitk", seed=3)
    plain = run(dec, SENTENCES, WaitK(k=2))
    headed = run(dec, SENTENCES, WaitKWithHead(k=2, head=head))
    for sentence, (tokens, delays), (h_tokens, h_delays) in zip(SENTENCES, plain, headed):
        # the window is still wait-k's (t + k), so the tokens are the same; only the delays move
        assert h_tokens == tokens
        assert all(h >= d for h, d in zip(h_delays, delays))
        n = len(sentence.split())
        assert h_delays[0] == (max(2, head) if max(2, head) <= n else n + 1)
    if head <= 2:   # a head within wait-k's own lag changes nothing
        assert headed == plain


def test_example_policy_batched_equals_alone(word_tok):
    """Streams of different policies share one batched step and write what they write alone."""
    WaitKWithHead = example_policy()
    dec = random_decoder(word_tok, "waitk", seed=4)
    policies = [WaitK(k=1), WaitKWithHead(k=2, head=5), WaitK(k=3), WaitKWithHead(k=1, head=3)]
    alone = [run(dec, [s], p)[0] for s, p in zip(SENTENCES, policies)]
    states = [dec.new_stream(policy=p) for p in policies]
    for s, sentence in zip(states, SENTENCES):
        dec.push(s, sentence.split())
        dec.finish(s)
    dec.advance(states)
    assert [(s.target_tokens, s.token_delays) for s in states] == alone


def test_registry_picks_each_policy_from_the_model(word_tok):
    for name, cls in (("waitk", WaitK), ("gma", Gma), ("offline", Offline)):
        cfg = tiny_config(word_tok, name)
        assert policy_class(cfg) is cls and policy_named(name) is cls and cfg.policy == name
        assert POLICIES[cfg.attention] is cls
        p = make_policy(cfg)
        assert p.kind == name
        # the slot fields the policy asks for are the ones the step's rows carry
        dec = random_decoder(word_tok, name)
        rows = dec.pool.rows.tensors()
        assert set(cls.slot_fields(cfg)) <= set(rows)
        assert not ({"k", "delta", "running"} - set(cls.slot_fields(cfg))) & set(rows)


def test_settings_are_validated_by_their_policy(word_tok):
    waitk, gma, offline = (tiny_config(word_tok, p) for p in ("waitk", "gma", "offline"))
    with pytest.raises(PolicyError, match="k must be"):
        make_policy(waitk, k=0)
    with pytest.raises(PolicyError, match="delta is a GMA setting"):
        make_policy(waitk, delta=1.0)
    with pytest.raises(PolicyError, match="delta must be"):
        make_policy(gma, delta=-1)
    with pytest.raises(PolicyError, match="beam search"):
        make_policy(gma, beam=2)
    with pytest.raises(PolicyError, match="no latency setting"):
        make_policy(offline, k=3)
    with pytest.raises(PolicyError, match="between 1 and 8"):
        make_policy(waitk, k=9).check_limits(8, 4.0)
    make_policy(gma, delta=4.0).check_limits(8, 4.0)
    assert WaitK.knobs(waitk, 8, 4.0) == {"k": {"default": 2, "min": 1, "max": 8}}
    assert Offline.knobs(offline, 8, 4.0) == {}


def test_the_slot_rows_follow_the_host(word_tok):
    """What the device holds per slot (target position, last token, source read) equals the host's values
    after every step: the step moves written rows on itself and uploads only what the host changed."""
    torch.manual_seed(0)
    for policy in ("waitk", "gma"):
        dec = random_decoder(word_tok, policy, seed=5)
        states = [dec.new_stream() for _ in SENTENCES]
        for s, sentence in zip(states, SENTENCES):
            dec.push(s, sentence.split()[:2])
        for round_ in range(300):
            live = [s for s in states if not s.done]
            if not live:
                break
            if round_ == 3:
                for s, sentence in zip(states, SENTENCES):
                    if not s.done:
                        dec.push(s, sentence.split()[2:])
                        dec.finish(s)
            dec.step(live)
            rows = dec.pool.rows
            for s in live:
                if s.done or s.dirty:
                    continue
                assert int(rows.t[s.slot]) == len(s.target_tokens)
                assert int(rows.prev[s.slot]) == (s.target_tokens[-1] if s.target_tokens else dec.cfg.bos_id)
                assert int(rows.avail[s.slot]) == s.available
                assert bool(rows.finished[s.slot]) == s.source_finished
        assert all(s.done for s in states)
        # and the whole run writes what simulate (its own stepping) writes
        for s, r in zip(states, simulate(dec, SENTENCES, chunks=[[2, len(x.split()) - 2] if len(x.split()) > 2
                                                                   else [len(x.split())] for x in SENTENCES])):
            assert (s.translation, s.token_delays) == (r.prediction, r.token_delays)


@pytest.mark.parametrize("policy,setting,values", [("gma", "delta", (0.5, 2.0)), ("waitk", "k", (1, 3))])
def test_a_reused_slot_starts_from_its_new_streams_values(word_tok, policy, setting, values):
    """A new stream touches no device memory: its slot's rows (the policy's values, GMA's running sums) are
    reset by its first step, with every other new stream's. A slot reused after a stream with other values
    and sums writes what a decoder that never used it writes."""
    from tests.test_cuda_graphs import outputs
    fresh_dec = random_decoder(word_tok, policy, seed=4)
    want = outputs(simulate(fresh_dec, SENTENCES[:2], batch_size=2, **{setting: values[1]}))
    dec = random_decoder(word_tok, policy, seed=4)
    outputs(simulate(dec, SENTENCES, batch_size=4, **{setting: values[0]}))   # every slot used and freed
    before = {n: t.clone() for n, t in dec.pool.rows.tensors().items()}
    s = dec.new_stream(**{setting: values[1]})
    assert s.fresh and all(torch.equal(before[n], t) for n, t in dec.pool.rows.tensors().items())
    # once it has decoded, its slot's rows are what a never-used decoder's first slot holds after the same steps
    ref = fresh_dec.new_stream(**{setting: values[1]})
    for d, x in ((dec, s), (fresh_dec, ref)):
        d.push(x, SENTENCES[1].split())
        d.advance([x])
    assert s.slot == ref.slot == 0 and not s.fresh
    for name, t in dec.pool.rows.tensors().items():
        assert torch.equal(t[s.slot], fresh_dec.pool.rows.tensors()[name][ref.slot]), name
    assert float(getattr(dec.pool.rows, setting)[s.slot]) == values[1]
    dec.close(s)
    fresh_dec.close(ref)
    assert outputs(simulate(dec, SENTENCES[:2], batch_size=2, **{setting: values[1]})) == want
    if policy == "gma":   # (the earlier streams left sums in the slots: the reset is what made them equal)
        assert before["running"].abs().sum() > 0
