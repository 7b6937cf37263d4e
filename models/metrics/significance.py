"""Paired bootstrap resampling (Koehn 2004) for corpus BLEU: is a change between two systems on one test
set more than the draw of its sentences?

Both systems are scored on the same resampled sentences (drawn with replacement, fixed seed), from
per-sentence n-gram statistics, so 1,000 resamples of a few hundred sentences take well under a second.
Used by the shipping gate of a training round (recipes/round_gate.py) and the before/after tables of a
decoding option (recipes/decoding_table.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

RESAMPLES = 1000


def _bleu():
    from sacrebleu.metrics.bleu import BLEU
    return BLEU()


def bleu_stats(hypotheses: list[str], references: list[str]) -> np.ndarray:
    """One row per sentence: hypothesis and reference length, n-gram matches and counts (n = 1..4),
    the statistics corpus BLEU sums (sacrebleu's defaults: 13a tokens, no smoothing)."""
    return np.array(_bleu()._extract_corpus_statistics(hypotheses, [references]), dtype=np.int64)


def corpus_bleu(stats: np.ndarray) -> float:
    return _bleu()._compute_score_from_stats(list(stats.sum(0))).score


def outputs_stats(path: Path) -> tuple[list[str], np.ndarray]:
    """The sources and per-sentence BLEU statistics of an `evaluate` outputs file (one JSON line per
    sentence with `source`, `prediction` and `reference`)."""
    lines = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    return [x["source"] for x in lines], bleu_stats([x["prediction"] for x in lines],
                                                    [x["reference"] for x in lines])


def share_not_behind(old: np.ndarray, new: np.ndarray, resamples: int = RESAMPLES, seed: int = 1) -> float:
    """Share of resamples in which `new` scores at least `old`: the p-value of "new is worse" (small when
    the new system is behind on nearly any sample of these sentences). Swap the arguments for a rise."""
    if len(old) != len(new) or not len(old):
        raise ValueError("paired bootstrap needs the same, non-empty list of sentences for both systems")
    draws = np.random.default_rng(seed).integers(0, len(old), size=(resamples, len(old)))
    return sum(corpus_bleu(new[i]) >= corpus_bleu(old[i]) for i in draws) / resamples


def fall_p_value(old_path: Path, new_path: Path) -> float:
    """`share_not_behind` of two `evaluate` outputs files of one test set (same sentences, same order)."""
    (old_src, old), (new_src, new) = outputs_stats(old_path), outputs_stats(new_path)
    if old_src != new_src:
        raise ValueError(f"{old_path} and {new_path} translate different sentences")
    return share_not_behind(old, new)
