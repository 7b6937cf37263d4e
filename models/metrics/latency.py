"""Latency metrics of simultaneous translation: AL, LAAL, AP, DAL and CW.

The one implementation used by the whole project (the `evaluate` command, the
SimulEval scorer in `agents/scorers.py`, the server's live per-sentence stats).
Pure Python, no torch.

Notation: ``delays[i]`` (d_{i+1} in the papers) is the number of source units
read when target unit i+1 was written; ``source_len`` is |x|; the "target
length" |y| sets the rate γ = |y| / |x|.

Two conventions (docs/evaluation.md):

1. SimulEval 1.1.4 -- :func:`sentence_scores`. Units are whitespace words, no
   EOS. AL and AP take |y| from the reference when one is given (SimulEval's
   default; ``use_ref_len=False`` is its ``--no-use-ref-len``), DAL always from
   the hypothesis, LAAL from max(hypothesis, reference). The formulas repeat
   SimulEval's arithmetic operation by operation, so the numbers are identical to
   the last bit (tests/test_latency.py checks it). SimulEval counts the
   reference as ``len(reference.split(" "))`` (a single-space split) and the
   hypothesis as ``len(prediction.split())``; pass lengths counted the same way
   to get its numbers.
2. The GMA paper's script -- :func:`paper_convention_scores`. Units are subword
   tokens, the source EOS and the target EOS both count, γ from the hypothesis.

Both: the corpus score is the plain mean of sentence scores
(:func:`corpus_scores`). A sentence with no output has no latency: the
functions raise ValueError for it (SimulEval skips such sentences).
"""
from __future__ import annotations

import math
import numbers
import statistics
from dataclasses import dataclass, fields
from typing import Iterable, Sequence

__all__ = [
    "LatencyScores", "average_lagging", "length_adaptive_average_lagging",
    "average_proportion", "differentiable_average_lagging", "consecutive_wait",
    "sentence_scores", "corpus_scores", "paper_convention_scores", "stream_laal_sentence",
]


@dataclass(frozen=True)
class LatencyScores:
    al: float
    laal: float
    ap: float
    dal: float
    cw: float

    def as_dict(self) -> dict[str, float]:
        """{"AL": ..., "LAAL": ..., "AP": ..., "DAL": ..., "CW": ...}"""
        return {f.name.upper(): getattr(self, f.name) for f in fields(self)}


# ---------------------------------------------------------------- validation

def _check_length(name: str, value) -> None:
    if (not isinstance(value, numbers.Real) or isinstance(value, bool)
            or not math.isfinite(value) or value <= 0):
        raise ValueError(f"{name} must be a positive number, got {value!r}")


def _delays(delays: Iterable[float], source_len: float | None) -> list:
    """The delays as a list, after checking they describe a real read/write schedule.

    ``source_len=None`` skips the upper bound (CW does not need |x|).
    """
    if source_len is not None:
        _check_length("source_len", source_len)
    delays = list(delays)
    if not delays:
        raise ValueError("delays is empty: a sentence with no written target unit has no latency")
    prev = 0
    for i, d in enumerate(delays):
        if isinstance(d, bool) or not isinstance(d, numbers.Real) or not math.isfinite(d):
            raise ValueError(f"delays[{i}] = {d!r} is not a finite number")
        if d < prev:
            what = "negative" if i == 0 else f"smaller than delays[{i - 1}] = {prev!r}"
            raise ValueError(f"delays must be non-decreasing and >= 0: delays[{i}] = {d!r} is {what}")
        if source_len is not None and d > source_len:
            raise ValueError(f"delays[{i}] = {d!r} exceeds source_len = {source_len!r}: "
                             "a target unit cannot wait for more source than there is")
        prev = d
    return delays


# ------------------------------------------------------------- the metrics
# Each loop below performs SimulEval 1.1.4's float operations in SimulEval's
# order (simuleval/evaluator/scorers/latency_scorer.py); keep it that way, the
# tests compare to the last bit.

def _lagging(delays: Sequence[float], source_len: float, gamma: float) -> float:
    """AL's sum: the lag of each target word behind an ideal writer at rate gamma, up to and
    including the first word written once the whole source (of length source_len) was read."""
    total = 0
    tau = 0
    for t_minus_1, d in enumerate(delays):
        total += d - t_minus_1 / gamma
        tau = t_minus_1 + 1
        if d >= source_len:
            break
    return float(total / tau)


def average_lagging(delays: Sequence[float], source_len: float, target_len: float) -> float:
    """AL (Ma et al. 2019): (1/τ) Σ_{i≤τ} d_i − (i−1)/γ, γ = target_len / source_len.

    τ is the first i with d_i ≥ |x| (all of them if none). ``target_len`` is the
    |y| of γ: the reference length (SimulEval's default) or the hypothesis length.
    SimulEval's guard "d_1 > |x| → AL = d_1" cannot fire here: such delays are
    rejected.
    """
    delays = _delays(delays, source_len)
    _check_length("target_len", target_len)
    return _lagging(delays, source_len, target_len / source_len)


def length_adaptive_average_lagging(delays: Sequence[float], source_len: float,
                                    hyp_len: int, ref_len: float | None) -> float:
    """LAAL (Papi et al. 2022): AL with γ = max(hyp_len, ref_len) / source_len.

    Over-generation cannot lower it below the reference-rate AL. Without a
    reference (``ref_len=None``) it is AL with the hypothesis length.
    """
    delays = _delays(delays, source_len)
    _check_hyp_len(delays, hyp_len)
    if ref_len is not None:
        _check_length("ref_len", ref_len)
    return average_lagging(delays, source_len, hyp_len if ref_len is None else max(hyp_len, ref_len))


def average_proportion(delays: Sequence[float], source_len: float, target_len: float) -> float:
    """AP (Cho & Esipova 2016): Σ d_i / (|x| · target_len); 1.0 for offline with target_len = |y|."""
    delays = _delays(delays, source_len)
    _check_length("target_len", target_len)
    return _proportion(delays, source_len, target_len)


def _proportion(delays: Sequence[float], source_len: float, target_len: float) -> float:
    return float(sum(delays) / (source_len * target_len))


def differentiable_average_lagging(delays: Sequence[float], source_len: float,
                                   target_len: float) -> float:
    """DAL (Arivazhagan et al. 2019): (1/|y|) Σ g'_i − (i−1)/γ, γ = target_len / source_len.

    g'_1 = d_1, g'_i = max(d_i, g'_{i−1} + 1/γ): every target unit costs at least
    1/γ source units after the previous one, so DAL (unlike AL) also charges
    writing many units at once. The mean is over the written units; SimulEval
    (and :func:`sentence_scores`) always passes target_len = hypothesis length.
    """
    delays = _delays(delays, source_len)
    _check_length("target_len", target_len)
    return _differentiable_lagging(delays, source_len, target_len)


def _differentiable_lagging(delays: Sequence[float], source_len: float, target_len: float) -> float:
    gamma = target_len / source_len
    total = 0
    g_prime_last = 0
    for i_minus_1, d in enumerate(delays):
        g_prime = d if i_minus_1 == 0 else max(d, g_prime_last + 1 / gamma)
        total += g_prime - i_minus_1 / gamma
        g_prime_last = g_prime
    return float(total / len(delays))


def consecutive_wait(delays: Sequence[float]) -> float:
    """CW (Gu et al. 2017): the mean length of a source segment read between two writes.

    c_i = d_i − d_{i−1} (d_0 = 0); CW = Σ c_i / #{i : c_i > 0} = d_|y| / (number of
    distinct delays > 0). 1 = word-by-word streaming, |x| = offline. Source read
    after the last write does not count. All delays 0 (nothing read) gives 0.
    Example: delays 2,2,5,5,5,7 → segments 2,3,2 → CW = 7/3.
    """
    return _consecutive_wait(_delays(delays, None))


def _consecutive_wait(delays: Sequence[float]) -> float:
    segments = 0
    prev = 0
    for d in delays:
        if d > prev:
            segments += 1
        prev = d
    return float(delays[-1] / segments) if segments else 0.0


def _check_hyp_len(delays: Sequence[float], hyp_len: int) -> None:
    n = len(delays)
    if hyp_len != n:
        raise ValueError(f"hyp_len = {hyp_len!r} but there are {n} delays: "
                         "give one delay per hypothesis unit")


# ------------------------------------------------------------- conventions

def sentence_scores(delays: Sequence[float], source_len: float, hyp_len: int,
                    ref_len: float | None = None, use_ref_len: bool = True) -> LatencyScores:
    """All five metrics of one sentence in SimulEval 1.1.4's convention.

    AL and AP use ``ref_len`` for γ when it is given and ``use_ref_len`` is true
    (otherwise ``hyp_len``); DAL uses ``hyp_len``; LAAL uses max(hyp_len, ref_len)
    -- and, like SimulEval, plain ``hyp_len`` when ``use_ref_len`` is false, so
    under ``--no-use-ref-len`` LAAL == AL. ``hyp_len`` must equal len(delays).
    """
    delays = _delays(delays, source_len)
    _check_hyp_len(delays, hyp_len)
    if ref_len is not None:
        _check_length("ref_len", ref_len)
    ref = ref_len if (use_ref_len and ref_len is not None) else None
    gamma_len = hyp_len if ref is None else ref
    laal_len = hyp_len if ref is None else max(hyp_len, ref)
    _check_length("target_len", gamma_len)   # (as each metric's own checks did)
    _check_length("target_len", hyp_len)
    # checked once here, then the unchecked arithmetic of each metric: the server scores every sentence it
    # finishes on its stepping thread, where checking the delays once per metric cost 21 -> 90 us a sentence
    return LatencyScores(
        al=_lagging(delays, source_len, gamma_len / source_len),
        laal=_lagging(delays, source_len, laal_len / source_len),
        ap=_proportion(delays, source_len, gamma_len),
        dal=_differentiable_lagging(delays, source_len, hyp_len),
        cw=_consecutive_wait(delays),
    )


def paper_convention_scores(subword_delays: Sequence[int], source_subwords: int) -> LatencyScores:
    """All five metrics of one sentence in the GMA paper's convention.

    "Both EOS counted" means, precisely:

    - the source has ``source_subwords + 1`` positions: its subwords, then EOS;
    - ``subword_delays`` has one entry per hypothesis subword, *without* the
      target EOS: the source positions available when it was written, the EOS
      included once the source had ended -- so every delay is in
      0..source_subwords+1, and a token written after the end of the source has
      delay source_subwords + 1 (``StreamState.available``);
    - the target EOS is appended as one more target unit with delay
      source_subwords + 1 (it is written once the whole source, EOS included, is
      known);
    - γ = (len(subword_delays) + 1) / (source_subwords + 1): hypothesis length,
      no reference, so LAAL == AL.

    A finished stream's ``token_delays`` already ends with its EOS: pass
    ``token_delays[:-1]``. An empty ``subword_delays`` (only EOS was written) is
    valid here. Example: 3 source subwords, delays 1,2,2,4,4 → units [1,2,2,4,4,4]
    over |x| = 4, γ = 6/4 → AL 1.25, AP 17/24, DAL 29/18, CW 4/3.
    """
    if (not isinstance(source_subwords, numbers.Integral) or isinstance(source_subwords, bool)
            or source_subwords < 0):
        raise ValueError(f"source_subwords must be an integer >= 0, got {source_subwords!r}")
    source_len = source_subwords + 1
    delays = _delays(list(subword_delays) + [source_len], source_len)
    return sentence_scores(delays, source_len, len(delays))


def corpus_scores(scores: Iterable[LatencyScores]) -> LatencyScores:
    """The plain mean of sentence scores, field by field (as SimulEval: ``statistics.mean``)."""
    scores = list(scores)
    if not scores:
        raise ValueError("no sentence scores to average")
    return LatencyScores(**{f.name: float(statistics.mean(getattr(s, f.name) for s in scores))
                            for f in fields(LatencyScores)})


# ------------------------------------------------------------- long form

def stream_laal_sentence(times: Sequence[float], start: float, duration: float, ref_len: int) -> float:
    """LAAL of one reference sentence of a talk, in the talk's clock (StreamLAAL, Papi et al. 2024).

    ``times`` are the emission times of the target words that the minimum-WER
    re-alignment gave to this sentence, ``start`` and ``duration`` the sentence's
    span in the source stream. Delays are ``times - start``; γ = max(len(times),
    ref_len) / duration. Unlike the per-sentence metrics, a re-aligned word may
    come before the sentence starts (a negative delay) or long after it ends, so
    the delays are not checked against a read/write schedule; as in SimulEval's
    AL (and simulstream's StreamLAAL), a first delay beyond the duration is the
    score itself. StreamLAAL is the plain mean over the sentences that received
    at least one word.
    """
    _check_length("duration", duration)
    _check_length("ref_len", ref_len)
    if not times:
        raise ValueError("no target word was aligned to this sentence: it has no latency")
    delays = [t - start for t in times]
    if delays[0] > duration:
        return float(delays[0])
    gamma = max(len(delays), ref_len) / duration
    return _lagging(delays, duration, gamma)
