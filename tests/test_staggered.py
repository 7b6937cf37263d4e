"""Out-of-phase arrivals (models/benchmarks/staggered.py, `bench step --arrivals staggered`): the same
translations as `simulate`, with most steps encoding, as in a server."""
from __future__ import annotations

import pytest
from conftest import POLICIES, random_decoder

from models.benchmarks.host_overhead import TimedDecoder, bench_host_overhead
from models.benchmarks.staggered import staggered
from models.data.synthetic import make_pairs
from models.step import StreamingDecoder
from models.translate import simulate


def outputs(results):
    return [(r.source, r.prediction, r.token_delays, r.target_tokens) for r in results]


@pytest.mark.parametrize("policy", POLICIES)
def test_staggered_arrivals_translate_as_simulate_does(piece_tok, policy, one_torch_thread):
    dec = random_decoder(piece_tok, policy, seed=11)
    sentences = [s for s, _ in make_pairs(9, seed=3)] + [""]   # (an empty line: a sentence of no words)
    want = outputs(simulate(dec, sentences, batch_size=4))
    for streams, gap in ((1, 1), (3, 4), (4, 2), (16, 4)):   # (more streams than sentences: some never start)
        assert outputs(staggered(dec, sentences, streams=streams, gap=gap)) == want
    assert dec.streams_in_cache == 0   # every stream's slot given back


def test_most_staggered_steps_encode_where_lockstep_ones_mostly_only_write(piece_tok, one_torch_thread):
    model = random_decoder(piece_tok, "gma", seed=2).model
    sentences = [s for s, _ in make_pairs(24, seed=8)]
    lock, stag = TimedDecoder(model, piece_tok), TimedDecoder(model, piece_tok)
    simulate(lock, sentences, batch_size=8)
    staggered(stag, sentences, streams=8, gap=4)
    # (`bench step` with the shipped gma_delta1 on 64 unseen sentences: docs/benchmarks.md)
    assert stag.encoding_steps / len(stag.step_seconds) > 2 * lock.encoding_steps / len(lock.step_seconds)


def test_host_overhead_rows_with_staggered_arrivals(word_tok):
    dec = random_decoder(word_tok, "waitk", seed=4)
    sentences = [s for s, _ in make_pairs(6, seed=5)]
    rows = bench_host_overhead(dec.model, word_tok, sentences, batch_sizes=(1, 3), sentences=4, rounds=1,
                               arrivals="staggered")
    plain = simulate(StreamingDecoder(dec.model, word_tok), sentences[:4])
    assert all(r["identical"] and r["target_tokens"] == sum(p.target_tokens for p in plain) for r in rows)
    lockstep = bench_host_overhead(dec.model, word_tok, sentences, batch_sizes=(3,), sentences=4, rounds=1)
    assert rows[1]["encoding_share"] > lockstep[0]["encoding_share"]   # out of phase, more steps encode
    with pytest.raises(ValueError, match="arrivals: one of lockstep, staggered"):
        bench_host_overhead(dec.model, word_tok, sentences, arrivals="bursty")
    with pytest.raises(ValueError, match="at least 1"):
        staggered(dec, sentences, streams=0)


def test_bench_step_takes_staggered_arrivals(tmp_path, word_tok):
    """The real command line: the host overhead table says how words arrived, and its rows write what
    lockstep arrivals write."""
    import json
    from test_host_overhead import cli

    from models.checkpoint import save_checkpoint
    save_checkpoint(tmp_path / "gma", random_decoder(word_tok, "gma", seed=6).model, word_tok, dtype=None)
    src = tmp_path / "source.txt"
    src.write_text("\n".join(s for s, _ in make_pairs(4, seed=7)) + "\n")
    out = tmp_path / "step.json"
    r = cli("bench", "step", "--device", "cpu", "--checkpoint", str(tmp_path / "gma"), "--source", str(src),
            "--batch-sizes", "1,3", "--sentences", "3", "--rounds", "1", "--arrivals", "staggered", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "host overhead of the fast step, staggered arrivals:" in r.stdout
    data = json.loads(out.read_text())
    assert data["arrivals"] == "staggered" and len(data["host_overhead"]) == 2
    assert all(h["identical"] and h["same_as_first"] for h in data["host_overhead"])
    bad = cli("bench", "step", "--arrivals", "bursty")
    assert bad.returncode == 2 and "invalid choice: 'bursty'" in bad.stderr
