"""A sentence-boundary classifier for unbounded text streams (issue 29).

The server's `auto_segment` ends a sentence after a word ending in . ! ? …;
help-page titles, list items and Bible verses ending in ; or : have none, so
whole runs of them become one over-long sentence. This classifier decides,
at each gap between two words of the stream, whether a sentence ends there,
looking one word ahead: the gap after word j is judged when word j+1 arrives,
so no word waits (it is pushed at once), only the end of a sentence is known
one word later.

The model is a logistic regression over hashed features of the words around
the gap (the last two words of the open sentence, the next word, their
shapes, the open sentence's length). It is trained on the training corpora's
own order (prepare-data's per-source train files keep each package's order:
help pages, Bible books, game files), never on a valid or test file; the
threshold is chosen on the valid talks. Scoring is pure Python plus a weight
lookup, a few microseconds a word, so it runs on the server's event loop.

    DIR/
      segmenter.json          {"format": "simulserve-segmenter", "version": 1, "buckets": ..., "threshold": ...}
      weights.safetensors     {"weights": float16[buckets]}
"""
from __future__ import annotations

import json
import math
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from models.errors import UserError

FORMAT = "simulserve-segmenter"
VERSION = 1
DEFAULT_BUCKETS = 2 ** 18
SHIPPED_SEGMENTER = Path(__file__).resolve().parent / "segmenters" / "boundary_de"
_LENGTH_BUCKETS = (1, 2, 3, 4, 6, 9, 13, 20, 30)


class SegmenterError(UserError):
    pass


_SENTENCE_END = re.compile(r"[.!?…。！？][\"'»«”’)\]]*$")


def ends_sentence(word: str) -> bool:
    """auto_segment's punctuation rule: a word ending in sentence-final punctuation (a closing quote or
    bracket may follow) closes the sentence."""
    return bool(_SENTENCE_END.search(word))


def _char_class(c: str) -> str:
    if c.isupper():
        return "A"
    if c.islower():
        return "a"
    if c.isdigit():
        return "9"
    return c          # punctuation keeps its identity: ; : , ) " differ


def _shape(word: str) -> str:
    """First character's class, last character's class, and whether the word is all caps."""
    return _char_class(word[0]) + _char_class(word[-1]) + ("U" if len(word) > 1 and word.isupper() else "")


def _length_bucket(n: int) -> int:
    return sum(n >= b for b in _LENGTH_BUCKETS)


def gap_features(open_words: list[str], nxt: str) -> list[str]:
    """Features of the gap between the open sentence's last word and `nxt` (the open sentence is not empty)."""
    prev = open_words[-1]
    prev2 = open_words[-2] if len(open_words) > 1 else "<s>"
    end, nshape = _char_class(prev[-1]), _shape(nxt)
    length = _length_bucket(len(open_words))
    return [
        "bias",
        f"p={prev}", f"n={nxt}", f"pn={prev}|{nxt}", f"pp={prev2}|{prev}",
        f"pl={prev.lower()}", f"nl={nxt.lower()}",
        f"psx={prev[-3:].lower()}", f"ps={_shape(prev)}", f"ns={nshape}",
        f"pe|ns={end}|{nshape}", f"p|ns={prev}|{nshape}", f"pe|n={end}|{nxt}",
        f"len={length}", f"len|pe={length}|{end}", f"len|ns={length}|{nshape}",
    ]


def hash_features(features: list[str], buckets: int) -> list[int]:
    return [zlib.crc32(f.encode("utf-8")) % buckets for f in features]


@dataclass
class BoundaryModel:
    """Weights over hashed features and the decision threshold on P(boundary)."""
    weights: list[float]
    threshold: float = 0.5
    trained_on: dict | None = None

    @property
    def buckets(self) -> int:
        return len(self.weights)

    def probability(self, open_words: list[str], nxt: str) -> float:
        w = self.weights
        z = sum(w[i] for i in hash_features(gap_features(open_words, nxt), len(w)))
        return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))

    def ends_before(self, open_words: list[str], nxt: str) -> bool:
        """Does the open sentence end before `nxt`? (False for an empty open sentence.)"""
        return bool(open_words) and self.probability(open_words, nxt) >= self.threshold

    # ------------------------------------------------------------------ files
    def save(self, directory: str | Path) -> Path:
        import torch
        from safetensors.torch import save_file
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        save_file({"weights": torch.tensor(self.weights, dtype=torch.float16)}, str(d / "weights.safetensors"))
        meta = {"format": FORMAT, "version": VERSION, "buckets": self.buckets, "threshold": self.threshold,
                "lookahead_words": 1, "trained_on": self.trained_on or {}}
        (d / "segmenter.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
        return d


def load_boundary_model(directory: str | Path | None = None) -> BoundaryModel:
    """The segmenter in `directory` (default: the shipped German one); every malformation is a SegmenterError."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file
    d = Path(directory) if directory is not None else SHIPPED_SEGMENTER
    meta_path, weights_path = d / "segmenter.json", d / "weights.safetensors"
    for p in (meta_path, weights_path):
        if not p.is_file():
            raise SegmenterError(f"{p} is missing: a segmenter directory holds segmenter.json and weights.safetensors "
                                 "(`simulserve train-segmenter` writes both)")
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SegmenterError(f"{meta_path} is not valid JSON: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise SegmenterError(f"{meta_path}: not a {FORMAT} version {VERSION} file")
    threshold = meta.get("threshold")
    if not isinstance(threshold, (int, float)) or not 0.0 < threshold < 1.0:
        raise SegmenterError(f"{meta_path}: threshold must be a number between 0 and 1, not {threshold!r}")
    try:
        weights = load_file(str(weights_path)).get("weights")
    except (SafetensorError, OSError) as e:
        raise SegmenterError(f"{weights_path}: {e}") from None
    if weights is None or weights.ndim != 1 or weights.shape[0] != meta.get("buckets"):
        raise SegmenterError(f"{weights_path}: expected one 'weights' vector of {meta.get('buckets')} values")
    return BoundaryModel(weights.astype("float32").tolist(), float(threshold), meta.get("trained_on"))


# ------------------------------------------------------------------ applying it to a whole stream

def segment_ends(cuts: list[tuple[int, int]]) -> set[int]:
    """Word positions (0-based, in the stream) after which a segment ends, the stream's last word excluded."""
    ends, at = set(), 0
    for n, _ in cuts:
        at += n
        ends.add(at - 1)
    ends.discard(at - 1)
    return ends


def boundary_scores(streams: list[list[list[str]]], cutter) -> dict:
    """Precision, recall and F1 of the sentence ends that `cutter(words) -> cuts` finds in streams of reference
    sentences (each stream a talk), pooled over the streams; the end of each stream is not counted."""
    tp = fp = fn = 0
    for sentences in streams:
        words = [w for s in sentences for w in s]
        said = segment_ends(cutter(words))
        truth = segment_ends([(len(s), 0) for s in sentences if s])
        tp += len(said & truth)
        fp += len(said - truth)
        fn += len(truth - said)
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0, "boundaries": tp + fn}
