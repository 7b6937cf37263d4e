"""Why paper-convention AL goes negative: hypotheses that stop long before the source does.

    python recipes/short_hypotheses.py docs/results/outputs/test.ddtp/waitk.k=*.jsonl

Reads `evaluate`'s per-sentence outputs (one JSON object a line, with token_delays and
source_subwords). In the GMA paper's convention γ = |y| / |x| comes from the hypothesis, so a
hypothesis much shorter than its source makes the (i - 1) / γ term of AL large and AL negative.
The step turns an EOS predicted before the source has ended into a READ (models/step.py), so a
model that thinks the sentence is over stops writing and waits for the end of the source to write
EOS: its "stopped early" sentences are those whose last word came before half the source.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from models.metrics.latency import paper_convention_scores  # noqa: E402
from per_source_table import read_outputs  # noqa: E402  (one reader of evaluate's outputs)


def summarise(results) -> dict:
    """Counts over one output file's sentences (SentenceResult; those with at least the EOS written)."""
    out = {"sentences": 0, "negative_al": 0, "stopped_early": 0, "both": 0, "gamma_all": [], "gamma_negative": []}
    for r in results:
        delays, src = r.token_delays, r.source_subwords
        if not delays:
            continue
        al = paper_convention_scores(delays[:-1], src).al
        gamma = len(delays) / (src + 1)            # target pieces + EOS over source pieces + EOS
        last_word = delays[-2] if len(delays) > 1 else 0
        stopped = last_word < 0.5 * (src + 1)
        out["sentences"] += 1
        out["negative_al"] += al < 0
        out["stopped_early"] += stopped
        out["both"] += stopped and al < 0
        out["gamma_all"].append(gamma)
        if al < 0:
            out["gamma_negative"].append(gamma)
    return out


def main(paths: list[str]) -> None:
    print("| outputs | sentences | paper AL < 0 | mean γ, all | mean γ, AL < 0 | "
          "stopped before half the source | both |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for path in paths:
        s = summarise(read_outputs(Path(path))[0])
        mean = lambda xs: f"{statistics.mean(xs):.2f}" if xs else "–"  # noqa: E731
        name = f"{Path(path).parent.name}/{Path(path).stem}"
        print(f"| {name} | {s['sentences']} | {s['negative_al']} | {mean(s['gamma_all'])} | "
              f"{mean(s['gamma_negative'])} | {s['stopped_early']} | {s['both']} |")


if __name__ == "__main__":
    main(sys.argv[1:])
