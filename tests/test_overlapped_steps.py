"""Two lockstep groups whose steps overlap (models/benchmarks/overlapped.py, `bench step --arrivals overlapped`):
the translations `simulate` writes, with one lane's step launched while the other's is in flight."""
from __future__ import annotations

import pytest
from conftest import POLICIES, random_decoder

from models.benchmarks.host_overhead import ARRIVALS, TimedDecoder, bench_host_overhead
from models.benchmarks.overlapped import overlapped
from models.data.synthetic import make_pairs
from models.step import StreamingDecoder
from models.translate import simulate


def outputs(results):
    return [(r.source, r.prediction, r.token_delays, r.target_tokens) for r in results]


class InFlightDecoder(StreamingDecoder):
    """Counts the launches made while another launch was still in flight."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.flying = self.most = self.launches = 0

    def launch(self, states):
        pending = super().launch(states)
        self.launches += 1
        if pending.batch:
            self.flying += 1
            self.most = max(self.most, self.flying)
        return pending

    def collect(self, pending):
        if pending.batch:
            self.flying -= 1
        return super().collect(pending)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("form", ["default", "graphs-encoder"])
def test_overlapped_lanes_translate_as_simulate_does(piece_tok, policy, form, one_torch_thread):
    plain = random_decoder(piece_tok, policy, seed=13)
    dec = InFlightDecoder(plain.model, piece_tok, form=form)
    if dec.form.graphs:   # (two launches of one graph in flight share its buffers, in the stream's order)
        dec.capture_graphs(capacity=8, max_batch=4)
    sentences = [s for s, _ in make_pairs(11, seed=4)] + [""]   # (an empty line: a sentence of no words)
    for batch in (1, 3, 4):
        want = outputs(simulate(dec, sentences, batch_size=batch))
        dec.most = dec.launches = 0
        results, steps, seconds = overlapped(dec, sentences, batch)
        assert outputs(results) == want
        assert steps == dec.launches and seconds > 0
        assert dec.most == 2   # the lanes' steps really were in flight together
        assert dec.streams_in_cache == 0 and dec.flying == 0   # every slot given back, nothing left in flight


def test_one_lane_when_the_sentences_fill_one_batch(piece_tok, one_torch_thread):
    """Fewer than twice the batch: the second lane has nothing, and the steps run one after another."""
    plain = random_decoder(piece_tok, "waitk", seed=5)
    dec = InFlightDecoder(plain.model, piece_tok)
    sentences = [s for s, _ in make_pairs(4, seed=9)]
    results, steps, _ = overlapped(dec, sentences, 4)
    assert outputs(results) == outputs(simulate(dec, sentences, batch_size=4)) and dec.most == 1
    with pytest.raises(ValueError, match="at least 1"):
        overlapped(dec, sentences, 0)


def test_an_error_mid_round_leaves_no_step_in_flight_and_frees_every_slot(piece_tok, one_torch_thread):
    plain = random_decoder(piece_tok, "gma", seed=6)

    class Failing(InFlightDecoder):
        def launch(self, states):
            if self.launches == 5:
                raise RuntimeError("boom")
            return super().launch(states)

    dec = Failing(plain.model, piece_tok)
    with pytest.raises(RuntimeError, match="boom"):
        overlapped(dec, [s for s, _ in make_pairs(6, seed=2)], 2)
    assert dec.flying == 0 and dec.streams_in_cache == 0


def test_host_overhead_rows_with_overlapped_steps(word_tok, one_torch_thread):
    """The step wall is the loop's wall over its steps, and the rows write what lockstep rows write."""
    dec = random_decoder(word_tok, "gma", seed=4)
    sentences = [s for s, _ in make_pairs(6, seed=5)]   # (both lanes busy at batch 3; graphs-encoder: a pool of 6)
    rows = bench_host_overhead(dec.model, word_tok, sentences, batch_sizes=(3,), sentences=6, rounds=1,
                               arrivals="overlapped", paths=("default", "graphs-encoder"))
    lockstep = bench_host_overhead(dec.model, word_tok, sentences, batch_sizes=(3,), sentences=6, rounds=1)
    assert all(r["identical"] and r["same_as_first"] and r["step_wall_ms"] > 0 for r in rows)
    want = {w["batch_size"]: (w["steps"], w["target_tokens"], w["decoder_rows_per_step"]) for w in lockstep}
    assert len(rows) == 2   # (both forms: the same steps and trials, as a stream's steps do not depend on which it
    assert all((r["steps"], r["target_tokens"], r["decoder_rows_per_step"]) == want[r["batch_size"]]   # shares)
               for r in rows)
    timed = TimedDecoder(dec.model, word_tok)
    results = ARRIVALS["overlapped"](timed, sentences, 3)
    assert len(timed.step_seconds) == lockstep[0]["steps"] and len(results) == len(sentences)
    assert ARRIVALS["overlapped"](timed, [], 3) == []   # (no sentence, no step: nothing to divide by)
    with pytest.raises(ValueError, match="arrivals: one of lockstep, staggered, overlapped"):
        bench_host_overhead(dec.model, word_tok, sentences, arrivals="bursty")


def test_bench_step_takes_overlapped_arrivals(tmp_path, word_tok):
    """The real command line, with the host-overhead table alone."""
    import json
    from test_host_overhead import cli

    from models.checkpoint import save_checkpoint
    save_checkpoint(tmp_path / "gma", random_decoder(word_tok, "gma", seed=6).model, word_tok, dtype=None)
    src = tmp_path / "source.txt"
    src.write_text("\n".join(s for s, _ in make_pairs(6, seed=7)) + "\n")
    out = tmp_path / "step.json"
    r = cli("bench", "step", "--device", "cpu", "--checkpoint", str(tmp_path / "gma"), "--source", str(src),
            "--batch-sizes", "1,3", "--sentences", "6", "--rounds", "1", "--arrivals", "overlapped",
            "--paths", "graphs-encoder", "--host-only", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "host overhead of the fast step, overlapped arrivals:" in r.stdout
    # --host-only: that table alone (the GPU check's extra parts)
    assert "fast ms/token" not in r.stdout and "--step auto here" not in r.stdout
    data = json.loads(out.read_text())
    assert data["arrivals"] == "overlapped" and len(data["host_overhead"]) == 2 and data["step"] == []
    assert all(h["identical"] and h["outside_graphs_ms_per_step"] > 0 for h in data["host_overhead"])
