"""models/benchmarks/recorded_bodies.py: the graph forms' host work with the bodies taken out.

A recorded round returns the outputs its bodies gave, so the host must do exactly what it did with them: the
same translations, delays and steps, for every arrival pattern the benchmarks drive; a driving that differs from
the recorded one is an error, never a silent mix; and the bodies really do not run.
"""
from __future__ import annotations

import pytest
from conftest import random_decoder

from models.benchmarks.host_overhead import ARRIVALS, LANES, TimedDecoder
from models.benchmarks.recorded_bodies import RecordedBodies
from models.benchmarks.staggered import staggered
from models.data.synthetic import make_pairs
from models.translate import simulate


def _graphed(tok, policy: str, streams: int, seed: int) -> TimedDecoder:
    model = random_decoder(tok, policy, seed=seed).model
    dec = TimedDecoder(model, tok, form="graphs-encoder")   # (the benchmarks' drivers clock its steps)
    dec.capture_graphs(streams * 2, streams * 2)
    return dec


def _outputs(results):
    return [(r.target_tokens, r.token_delays, r.prediction) for r in results]


@pytest.mark.parametrize("policy", ["gma", "waitk"])
def test_recorded_rounds_write_what_the_bodies_did_without_running_them(piece_tok, policy):
    sentences = [s for s, _ in make_pairs(6, seed=11)]
    dec = _graphed(piece_tok, policy, 3, seed=2)
    ran = []   # every real body call
    for key, (graph, static, body) in list(dec.graphs.entries.items()):
        dec.graphs.entries[key] = (graph, static, lambda *x, body=body: ran.append(1) or body(*x))
    expected = _outputs(simulate(dec, sentences, batch_size=3))
    bodies = RecordedBodies(dec.graphs)
    bodies.record("lockstep")
    assert _outputs(simulate(dec, sentences, batch_size=3)) == expected
    bodies.record("staggered")
    assert _outputs(staggered(dec, sentences, 3)) == expected   # (a stream's output: not when its words come)
    recorded = {name: len(kept) for name, kept in bodies.rounds.items()}
    assert all(n > 0 for n in recorded.values()) and len(ran) >= sum(recorded.values())
    ran.clear()
    for name, drive in (("lockstep", lambda: simulate(dec, sentences, batch_size=3)),
                        ("staggered", lambda: staggered(dec, sentences, 3))):
        bodies.replay(name)
        assert _outputs(drive()) == expected and bodies.finished(), name
    assert ran == []   # nothing computed in the replayed rounds
    bodies.restore()
    assert _outputs(simulate(dec, sentences, batch_size=3)) == expected and ran


def test_the_benchmarks_drivers_replay_their_recorded_rounds(word_tok):
    """The arrivals host_python.py drives (ARRIVALS), each recorded and replayed: the same steps each time."""
    sentences = [s for s, _ in make_pairs(8, seed=12)]
    dec = _graphed(word_tok, "gma", 2 * LANES["overlapped"], seed=3)
    bodies = RecordedBodies(dec.graphs)
    for name, drive in ARRIVALS.items():
        bodies.record(name)
        drive(dec, sentences, 2)
        bodies.replay(name)
        drive(dec, sentences, 2)
        assert bodies.finished(), name


def test_a_driving_unlike_the_recorded_one_is_an_error(word_tok):
    sentences = [s for s, _ in make_pairs(4, seed=13)]
    dec = _graphed(word_tok, "gma", 2, seed=4)
    bodies = RecordedBodies(dec.graphs)
    with pytest.raises(RuntimeError, match="no round recorded"):
        bodies.replay("lockstep")
    bodies.record("lockstep")
    simulate(dec, sentences[:1], batch_size=1)
    bodies.replay("lockstep")
    with pytest.raises(RuntimeError, match="steps differently"):   # more steps, or a batch of another graph
        simulate(dec, sentences, batch_size=2)
    bodies.replay("lockstep")
    assert not bodies.finished()   # (nothing replayed yet: a round that stops short is told apart)
