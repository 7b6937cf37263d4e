"""Latency metrics: the worked checks of the spec, and SimulEval 1.1.4 parity to the last bit."""
from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from argparse import Namespace
from fractions import Fraction
from pathlib import Path

import pytest

from models.metrics.latency import (
    LatencyScores,
    average_lagging,
    average_proportion,
    consecutive_wait,
    corpus_scores,
    differentiable_average_lagging,
    length_adaptive_average_lagging,
    paper_convention_scores,
    sentence_scores,
)

ROOT = Path(__file__).resolve().parents[1]


def wait_k_copy(k: int, n: int) -> list[int]:
    """Delays of a wait-k agent copying an n-word source (one word per step, then flush)."""
    return [min(k + i, n) for i in range(n)]


# ------------------------------------------------------------- worked checks (latency.md)

@pytest.mark.parametrize("k, al", [(1, 1.0), (3, 2.8), (5, 4.4)])
def test_wait_k_copy_corpus(k, al):
    lengths = [6, 9, 2, 8, 5]
    per_sentence = [sentence_scores(wait_k_copy(k, n), n, n, ref_len=n) for n in lengths]
    assert [s.al for s in per_sentence] == [min(k, n) for n in lengths]
    scores = corpus_scores(per_sentence)
    assert scores.al == pytest.approx(al)
    assert scores.dal == pytest.approx(al)  # copying at rate 1: DAL == AL
    assert scores.laal == scores.al


@pytest.mark.parametrize("n_src, n_tgt", [(1, 1), (4, 4), (7, 3), (5, 11)])
def test_offline(n_src, n_tgt):
    s = sentence_scores([n_src] * n_tgt, n_src, n_tgt)
    assert s.al == n_src
    assert s.dal == pytest.approx(n_src)
    assert s.ap == 1.0
    assert s.cw == n_src


def test_seven_word_reference_against_four_word_source():
    delays = [3, 4, 4, 4, 4, 4, 4]  # wait-3, then flush
    s = sentence_scores(delays, 4, 7, ref_len=7)
    assert s.al == pytest.approx(((3 - 0) + (4 - 1 / (7 / 4))) / 2)  # τ = 2
    assert round(s.al, 3) == 3.214


def test_reference_length_sets_gamma_of_al_and_ap_but_not_dal():
    delays = [1, 2, 3]  # a 3-word hypothesis of a 3-word source, the reference has 6 words
    with_ref = sentence_scores(delays, 3, 3, ref_len=6)
    without = sentence_scores(delays, 3, 3, ref_len=6, use_ref_len=False)
    assert without.al == 1.0 and without.ap == pytest.approx(2 / 3)
    assert with_ref.al == pytest.approx((1 + 1.5 + 2) / 3)  # under-generation is charged
    assert with_ref.ap == pytest.approx(6 / 18)
    assert with_ref.dal == without.dal == 1.0
    assert with_ref.laal == with_ref.al and without.laal == without.al


def test_sentence_scores_is_the_five_metrics_bit_for_bit():
    """sentence_scores checks the delays once and runs each metric's arithmetic unchecked: the same floats as the
    five public functions, each of which checks for itself, with and without a reference, integer and fractional."""
    rng = random.Random(7)
    for _ in range(2000):
        src = rng.randint(1, 40) if rng.random() < 0.8 else rng.uniform(0.5, 40.0)
        n = rng.randint(1, 60)
        delays = sorted(rng.randint(0, int(src)) if rng.random() < 0.7 else rng.uniform(0, src) for _ in range(n))
        ref = rng.choice([None, rng.randint(1, 60), rng.uniform(0.5, 60.0)])
        use_ref = rng.random() < 0.8
        s = sentence_scores(delays, src, n, ref_len=ref, use_ref_len=use_ref)
        r = ref if use_ref and ref is not None else None
        gamma_len = n if r is None else r
        assert s == LatencyScores(al=average_lagging(delays, src, gamma_len),
                                  laal=length_adaptive_average_lagging(delays, src, n, r),
                                  ap=average_proportion(delays, src, gamma_len),
                                  dal=differentiable_average_lagging(delays, src, n),
                                  cw=consecutive_wait(delays)), (delays, src, ref, use_ref)


# ------------------------------------------------------------- CW

@pytest.mark.parametrize("delays, cw", [
    ([2, 2, 5, 5, 5, 7], Fraction(7, 3)),   # segments 2, 3, 2
    ([1, 2, 3, 4], 1),                      # word by word
    ([3, 4, 5, 6, 6, 6], Fraction(6, 4)),   # wait-3 over 6 words
    ([7, 7, 7], 7),                         # offline
    ([0, 0, 2], 2),                         # writing before reading costs nothing
    ([0, 0], 0),                            # nothing read at all
])
def test_consecutive_wait(delays, cw):
    assert consecutive_wait(delays) == pytest.approx(float(cw))


# ------------------------------------------------------------- the paper's convention

def test_paper_convention_hand_example():
    # 3 source subwords + EOS = 4 positions; 5 hypothesis subwords, the last two
    # written after the source ended (delay 4); the target EOS adds one unit at 4.
    # units [1, 2, 2, 4, 4, 4], γ = 6/4, 1/γ = 2/3
    s = paper_convention_scores([1, 2, 2, 4, 4], 3)
    # AL: τ = 4 → (1 + (2 − 2/3) + (2 − 4/3) + (4 − 2)) / 4
    assert s.al == pytest.approx(1.25)
    assert s.laal == s.al
    assert s.ap == pytest.approx(17 / 24)
    # DAL: g' = 1, 2, 8/3, 4, 14/3, 16/3 → minus (i−1)·2/3 → 1, 4/3, 4/3, 2, 2, 2
    assert s.dal == pytest.approx(29 / 18)
    assert s.cw == pytest.approx(4 / 3)  # segments 1, 1, 2
    # the same units counted SimulEval's way (no EOS) give other numbers
    assert sentence_scores([1, 2, 2, 3, 3], 3, 5).al != pytest.approx(s.al)


def test_paper_convention_is_sentence_scores_with_both_eos():
    rng = random.Random(7)
    for _ in range(100):
        n = rng.randint(0, 20)
        d = sorted(rng.randint(0, n + 1) for _ in range(rng.randint(0, 25)))
        assert paper_convention_scores(d, n) == sentence_scores(d + [n + 1], n + 1, len(d) + 1)


def test_paper_convention_only_eos_written():
    assert paper_convention_scores([], 3) == LatencyScores(al=4.0, laal=4.0, ap=1.0, dal=4.0, cw=4.0)


# ------------------------------------------------------------- bad input

@pytest.mark.parametrize("call, message", [
    (lambda: average_lagging([], 3, 3), "delays is empty"),
    (lambda: sentence_scores([], 3, 0), "delays is empty"),
    (lambda: average_lagging([2, 1], 3, 2),
     r"non-decreasing.*delays\[1\] = 1 is smaller than delays\[0\] = 2"),
    (lambda: average_proportion([-1, 1], 3, 2), r"delays\[0\] = -1 is negative"),
    (lambda: differentiable_average_lagging([1, 4], 3, 2), r"delays\[1\] = 4 exceeds source_len = 3"),
    (lambda: consecutive_wait([1, float("nan")]), "not a finite number"),
    (lambda: average_lagging([0], 0, 1), "source_len must be a positive number"),
    (lambda: average_lagging([1], 1, 0), "target_len must be a positive number"),
    (lambda: sentence_scores([1, 2], 2, 3), "hyp_len = 3 but there are 2 delays"),
    (lambda: sentence_scores([1, 2], 2, 2, ref_len=0), "ref_len must be a positive number"),
    (lambda: length_adaptive_average_lagging([1], 1, 1, -2), "ref_len must be a positive number"),
    (lambda: paper_convention_scores([1, 5], 3), r"delays\[1\] = 5 exceeds source_len = 4"),
    (lambda: paper_convention_scores([1], -1), "source_subwords must be an integer >= 0"),
    (lambda: corpus_scores([]), "no sentence scores"),
])
def test_bad_input_raises_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_module_does_not_import_torch():
    code = "import sys, models.metrics.latency; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


# ------------------------------------------------------------- SimulEval 1.1.4 parity

def simuleval_text_instance(delays, source_len, ref_len):
    """A finished text-to-text instance as SimulEval's evaluator leaves it (word unit)."""
    from simuleval.evaluator.instance import TextToTextInstance

    ins = TextToTextInstance(0, None, Namespace(eval_latency_unit="word"))
    ins.source = [f"s{i}" for i in range(source_len)]
    ins.reference = None if ref_len is None else " ".join(f"r{i}" for i in range(ref_len))
    ins.prediction_list = [f"h{i}" for i in range(len(delays))]
    ins.delays = list(delays)
    return ins


def random_cases(seed: int, n: int):
    """(delays, source_len, ref_len) with every shape: short/long sources, under- and
    over-generation, writes before any read, flushes at |x|, no reference."""
    rng = random.Random(seed)
    for _ in range(n):
        src = rng.randint(1, 40)
        hyp = rng.randint(1, 60)
        low = rng.choice([0, 1, 1, 1])
        delays = sorted(rng.randint(low, src) for _ in range(hyp))
        if rng.random() < 0.5:  # flush: the tail is written after the whole source
            cut = rng.randint(0, hyp)
            delays = delays[:cut] + [src] * (hyp - cut)
        ref = None if rng.random() < 0.1 else rng.randint(1, 60)
        yield delays, src, ref


@pytest.mark.parametrize("use_ref_len", [True, False], ids=["ref-len", "no-use-ref-len"])
def test_equal_to_simuleval_scorers_bit_for_bit(use_ref_len):
    pytest.importorskip("simuleval")
    from simuleval.evaluator.scorers.latency_scorer import LATENCY_SCORERS_DICT

    scorers = {m: LATENCY_SCORERS_DICT[m](use_ref_len=use_ref_len) for m in ("AL", "LAAL", "AP", "DAL")}
    instances, ours = {}, []
    for i, (delays, src, ref) in enumerate(random_cases(seed=1234, n=600)):
        ins = simuleval_text_instance(delays, src, ref)
        instances[i] = ins
        mine = sentence_scores(delays, src, len(delays), ref_len=ref, use_ref_len=use_ref_len)
        ours.append(mine)
        theirs = {m: scorer.compute(ins) for m, scorer in scorers.items()}
        assert mine.as_dict() == {**theirs, "CW": mine.cw}, (delays, src, ref)
    corpus = corpus_scores(ours)
    for m, scorer in scorers.items():  # the corpus mean, through the scorer's __call__
        assert getattr(corpus, m.lower()) == scorer(instances), m


def test_equal_to_simuleval_on_fractional_delays():
    """Speech-style delays (ms, fractional), read back from an instances.log line."""
    pytest.importorskip("simuleval")
    from simuleval.evaluator.instance import LogInstance
    from simuleval.evaluator.scorers.latency_scorer import LATENCY_SCORERS_DICT

    rng = random.Random(99)
    for _ in range(200):
        src = rng.uniform(500, 9000)
        delays = sorted(rng.uniform(0, src) for _ in range(rng.randint(1, 30)))
        ref = rng.randint(1, 40)
        line = json.dumps({"index": 0, "delays": delays, "source_length": src,
                           "reference": " ".join(["r"] * ref), "prediction": ""})
        ins = LogInstance(line, latency_unit="word")
        mine = sentence_scores(delays, src, len(delays), ref_len=ref)
        for m in ("AL", "LAAL", "AP", "DAL"):
            assert mine.as_dict()[m] == LATENCY_SCORERS_DICT[m]().compute(ins), m


def test_simuleval_guards_agree_at_the_edges():
    """d_1 == |x| (the AL guard's boundary), one-word sources and one-word outputs."""
    pytest.importorskip("simuleval")
    from simuleval.evaluator.scorers.latency_scorer import LATENCY_SCORERS_DICT

    for delays, src, ref in [([1], 1, 1), ([1], 1, 9), ([5, 5], 5, 1), ([0], 3, 2), ([3], 3, None)]:
        ins = simuleval_text_instance(delays, src, ref)
        mine = sentence_scores(delays, src, len(delays), ref_len=ref).as_dict()
        for m in ("AL", "LAAL", "AP", "DAL"):
            assert mine[m] == LATENCY_SCORERS_DICT[m]().compute(ins), (m, delays, src, ref)


# ------------------------------------------------------------- the CW scorer in SimulEval

def test_cw_scorer_registered_by_importing_agents():
    pytest.importorskip("simuleval")
    import importlib

    import agents
    importlib.reload(agents)   # another test module may have imported it before simuleval was loaded
    from simuleval.evaluator.scorers import get_scorer_class

    scorer = get_scorer_class("latency", "CW")(use_ref_len=True)
    instances = {i: simuleval_text_instance(d, s, r) for i, (d, s, r) in enumerate(random_cases(5, 50))}
    expected = [consecutive_wait(ins.delays) for ins in instances.values()]
    assert scorer(instances) == pytest.approx(sum(expected) / len(expected))
    assert instances[0].metrics["CW"] == expected[0]


def test_simuleval_cli_scores_cw_with_user_dir_agents(tmp_path):
    """`simuleval --user-dir agents --latency-metrics CW` from the repository root."""
    pytest.importorskip("simuleval")
    rows = [([2, 2, 5, 5, 5, 7], 7), ([1, 2], 2)]  # CW 7/3 and 1
    with open(tmp_path / "instances.log", "w") as f:
        for i, (delays, src) in enumerate(rows):
            f.write(json.dumps({"index": i, "prediction": " ".join(["y"] * len(delays)),
                                "delays": delays, "elapsed": [0] * len(delays),
                                "reference": " ".join(["y"] * len(delays)),
                                "source_length": src}) + "\n")
    (tmp_path / "config.yaml").write_text("source_type: text\ntarget_type: text\n")
    out = subprocess.run(
        [sys.executable, "-c", "import sys; from simuleval.cli import main; sys.exit(main())",
         "--score-only", "--output", str(tmp_path), "--user-dir", "agents",
         "--latency-metrics", "AL", "CW", "--quality-metrics", "BLEU"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    header, values = out.stdout.strip().splitlines()[-2:]
    scores = dict(zip(header.split(), values.split()[1:]))  # pandas prints a row index first
    assert math.isclose(float(scores["CW"]), round((7 / 3 + 1) / 2, 3))
