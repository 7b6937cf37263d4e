"""How close test sets are to the training data: the share of test sentences whose German is a
(near-)duplicate of a training sentence.

    python recipes/near_duplicates.py --data data/de-en-everyday --sets everyday,unseen,dialogue

Two definitions, both on the German side after `prepare.leak_key` (lower case, every run of
punctuation and spaces one space — what prepare-data already compares across splits):

- exact: the normalised sentence is also a normalised training sentence;
- near: the character 4-grams of the normalised sentence (padded with one space at each end) and
  those of some training sentence have a Jaccard similarity >= t, for each t of --thresholds
  (default 0.8,0.6). Every exact duplicate is also a near one.

It also prints the share of the test sets' German words (normalised tokens) that occur in no training
sentence: closeness in vocabulary rather than in whole sentences.

Training sentences are `train.de` of the data directory (every source's train split; the
per-source `train.SOURCE.de` files hold the same lines). The search is exact, not sampled: prefix
filtering (two sets with Jaccard >= t share one of the |X| - ceil(t|X|) + 1 rarest grams of each)
finds every candidate, and the similarity of each candidate is computed in full.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.data.prepare import leak_key  # noqa: E402

N = 4


def grams(key: str) -> frozenset[str]:
    padded = " %s " % key
    if len(padded) <= N:
        return frozenset([padded])
    return frozenset(padded[i:i + N] for i in range(len(padded) - N + 1))


def prefix_size(size: int, threshold: float) -> int:
    return size - math.ceil(threshold * size) + 1


class NearIndex:
    """Training sentences indexed for exact and Jaccard >= threshold look-ups."""

    def __init__(self, sentences, threshold: float = 0.8):
        if not 0 < threshold <= 1:
            raise ValueError("threshold must be in (0, 1], not %r" % threshold)
        self.threshold = threshold
        self.keys = sorted({leak_key(s) for s in sentences} - {""})
        self.exact = set(self.keys)
        self.words = {w for k in self.keys for w in k.split()}
        self.sets = [grams(k) for k in self.keys]
        self.df = Counter(g for s in self.sets for g in s)
        self.postings: dict[str, list[int]] = defaultdict(list)
        for i, s in enumerate(self.sets):
            for g in self._prefix(s):
                self.postings[g].append(i)

    def _prefix(self, gs: frozenset[str]) -> list[str]:
        # rarest first (a gram no training sentence has counts 0); ties broken by the gram itself
        ordered = sorted(gs, key=lambda g: (self.df.get(g, 0), g))
        return ordered[:prefix_size(len(gs), self.threshold)]

    def best(self, sentence: str) -> tuple[float, str | None]:
        """(highest Jaccard >= threshold, that training sentence), or (0.0, None) below it."""
        key = leak_key(sentence)
        if key in self.exact:
            return 1.0, key
        gs = grams(key)
        lo, hi = self.threshold * len(gs), len(gs) / self.threshold
        best, which = 0.0, None
        seen = set()
        for g in self._prefix(gs):
            for i in self.postings.get(g, ()):
                if i in seen:
                    continue
                seen.add(i)
                other = self.sets[i]
                if not lo <= len(other) <= hi:
                    continue
                j = len(gs & other) / len(gs | other)
                if j > best:
                    best, which = j, self.keys[i]
        return (best, which) if best >= self.threshold else (0.0, None)


def rates(index: NearIndex, sentences: list[str], thresholds: list[float]) -> dict:
    """Exact and near counts; `index` built with a threshold <= min(thresholds), so its best
    match is the true best for every threshold asked."""
    exact, near = 0, Counter()
    examples = []
    words = [w for s in sentences for w in leak_key(s).split()]
    new_words = sum(w not in index.words for w in words)
    for s in sentences:
        score, match = index.best(s)
        if match is None:
            continue
        near.update(t for t in thresholds if score >= t)
        if score == 1.0 and leak_key(s) == match:
            exact += 1
        elif len(examples) < 5 and score >= max(thresholds):
            examples.append({"test": s, "train": match, "jaccard": round(score, 3)})
    n = len(sentences)
    pct = lambda c: round(100 * c / n, 2) if n else 0.0  # noqa: E731
    return {"sentences": n, "exact": exact, "exact_pct": pct(exact),
            "near": {str(t): near[t] for t in thresholds},
            "near_pct": {str(t): pct(near[t]) for t in thresholds},
            "words": len(words), "new_words": new_words,
            "new_words_pct": round(100 * new_words / len(words), 2) if words else 0.0,
            "near_examples": examples}


def read_lines(path: Path) -> list[str]:
    return Path(path).read_text(encoding="utf-8").splitlines()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=Path("data/de-en-everyday"))
    p.add_argument("--sets", default="everyday,unseen", help="test.SET.de files of --data, comma list")
    p.add_argument("--train", type=Path, nargs="+", help="training German files (default: DATA/train.de)")
    p.add_argument("--thresholds", default="0.8,0.6", help="Jaccard of character 4-grams, comma list")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)
    train = [line for f in (args.train or [args.data / "train.de"]) for line in read_lines(f)]
    thresholds = sorted({float(t) for t in args.thresholds.split(",") if t.strip()}, reverse=True)
    index = NearIndex(train, min(thresholds))
    results = {}
    for name in [s.strip() for s in args.sets.split(",") if s.strip()]:
        results[name] = rates(index, read_lines(args.data / ("test.%s.de" % name)), thresholds)
    print("training German: %d lines, %d distinct after normalisation; near = character 4-gram Jaccard"
          % (len(train), len(index.keys)))
    print("| set | sentences | exact | " + " | ".join("near >= %g" % t for t in thresholds)
          + " | words not in training |")
    print("|---|---:|---:|" + "---:|" * len(thresholds) + "---:|")
    for name, r in results.items():
        near = " | ".join("%d (%.1f %%)" % (r["near"][str(t)], r["near_pct"][str(t)]) for t in thresholds)
        print("| %s | %d | %d (%.1f %%) | %s | %d of %d (%.1f %%) |" % (
            name, r["sentences"], r["exact"], r["exact_pct"], near, r["new_words"], r["words"], r["new_words_pct"]))
    for name, r in results.items():
        for ex in r["near_examples"][:3]:
            print("  %s near: %r ~ %r (%.2f)" % (name, ex["test"], ex["train"], ex["jaccard"]))
    if args.json:
        args.json.write_text(json.dumps({"thresholds": thresholds, "train_lines": len(train),
                                         "sets": results}, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
