"""Scoring one run: BLEU and both latency conventions, and the text of a setting.

Shared by `simulserve evaluate` (agents/evaluate.py) and long-form evaluation (agents/longform.py),
which otherwise imported each other.
"""
from __future__ import annotations

import math

METRICS = ("AL", "LAAL", "AP", "DAL", "CW")


def setting_text(setting: dict) -> str:
    if "k" in setting:
        return f"k={setting['k']}"
    if "delta" in setting:
        return f"delta={setting['delta']:g}"
    return "offline" if setting.get("beam", 1) == 1 else f"offline beam={setting['beam']}"


def simuleval_ref_len(reference: str) -> int:
    """SimulEval 1.1.4's reference length: len(line.split(" ")) on the raw line."""
    return len(reference.split(" "))


def score_results(results, references: list[str], tokenize: str = "13a",
                  use_ref_len: bool = True) -> dict:
    """BLEU and both latency conventions of one run (simulate() results, aligned references)."""
    import sacrebleu

    from models.metrics.latency import corpus_scores, paper_convention_scores, sentence_scores

    predictions = [r.prediction for r in results]
    metric = sacrebleu.BLEU(tokenize=tokenize)
    bleu = metric.corpus_score(predictions, [references])
    words, empty = [], 0
    for r, ref in zip(results, references):
        if not r.delays:  # SimulEval cannot score a sentence without output; it is counted apart
            empty += 1
            continue
        words.append(sentence_scores(r.delays, r.source_words, len(r.delays),
                                     ref_len=simuleval_ref_len(ref), use_ref_len=use_ref_len))
    paper = corpus_scores(paper_convention_scores(r.token_delays[:-1], r.source_subwords)
                          for r in results)
    nan = {m: math.nan for m in METRICS}
    return {
        "BLEU": bleu.score,
        "bleu_signature": str(metric.get_signature()),
        "simuleval": corpus_scores(words).as_dict() if words else nan,
        "paper": paper.as_dict(),
        "sentences": len(results),
        "no_output": empty,
        "compute_ms_per_sentence": sum(r.compute_ms for r in results) / max(len(results), 1),
    }
