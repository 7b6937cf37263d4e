"""`simulserve train-segmenter`: train the sentence-boundary classifier (models/sentence_boundary.py).

Training streams are prepare-data's per-source train files (train.SOURCE.de),
which keep each package's order, so a stream reads as the package does: a
help page's title, then its paragraphs and list items; a Bible chapter's
verses. Each source gives at most `--max-lines` lines, in blocks spread over
the file, so the Bible does not outweigh the rest. Every gap between two
words whose first does not already end a sentence by punctuation is one
example: does a sentence end there? The threshold is then chosen on the valid
talks (valid.SET.de with its .docs), never on a test file.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

SUMMARY = "train the sentence-boundary classifier that segments unbounded streams"
DEFAULT_VALID_SETS = "bible,libreoffice,dialogue"


def register(sub) -> None:
    p = sub.add_parser(
        "train-segmenter", help=SUMMARY,
        description="Train the sentence-boundary classifier (auto_segment 'boundary') on prepare-data's per-source "
                    "train files and choose its threshold on the valid talks.",
        epilog="example:\n"
               "  simulserve train-segmenter --data data/de-en-everyday --out runs/segmenter",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=Path("data/de-en-everyday"), help="prepare-data output directory")
    p.add_argument("--out", type=Path, required=True, help="segmenter directory to write")
    p.add_argument("--src-lang", default="de")
    p.add_argument("--max-lines", type=int, default=40000, help="lines per source at most")
    p.add_argument("--buckets", type=int, default=2 ** 18, help="hashed feature buckets (weights shipped as fp16)")
    p.add_argument("--epochs", type=int, default=1,
                   help="passes over the gaps (1 chose best on the valid talks; 2 and 3 overfit)")
    p.add_argument("--valid-sets", default=DEFAULT_VALID_SETS, help="valid sets whose talks choose the threshold")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def read_lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def training_streams(data: Path, src_lang: str, max_lines: int) -> dict[str, list[list[str]]]:
    """source -> its train lines (word lists) in file order, at most max_lines of them in 20 blocks spread
    over the file."""
    from models.sentence_boundary import SegmenterError
    files = sorted(p for p in data.glob(f"train.*.{src_lang}") if p.name.count(".") == 2)
    if not files:
        raise SegmenterError(f"no train.SOURCE.{src_lang} files in {data}: run `simulserve prepare-data` first")
    streams = {}
    for f in files:
        lines = [line.split() for line in read_lines(f)]
        if len(lines) > max_lines:
            blocks, size = 20, max_lines // 20
            step = len(lines) // blocks
            lines = [s for b in range(blocks) for s in lines[b * step: b * step + size]]
        streams[f.name.split(".")[1]] = lines
    return streams


def gap_examples(sentences: list[list[str]]):
    """(features, label) for every gap of a stream whose first word does not end a sentence by punctuation;
    the open sentence is the reference's (teacher forcing)."""
    from models.sentence_boundary import ends_sentence, gap_features
    words = [(w, i == len(s) - 1) for s in sentences for i, w in enumerate(s)]
    open_words: list[str] = []
    for (w, last), (nxt, _) in zip(words, words[1:]):
        open_words.append(w)
        if not ends_sentence(w):
            yield gap_features(open_words, nxt), last
        if last or ends_sentence(w):
            open_words = []


def fit(streams: dict[str, list[list[str]]], buckets: int, epochs: int, seed: int, progress: bool) -> list[float]:
    """Logistic regression on hashed features (sum of one weight per feature), Adagrad, shuffled batches."""
    import torch
    from tqdm import tqdm

    from models.sentence_boundary import hash_features
    ids, offsets, labels = [], [], []
    for sentences in streams.values():
        for feats, label in gap_examples(sentences):
            offsets.append(len(ids))
            ids.extend(hash_features(feats, buckets))
            labels.append(float(label))
    n_feat = len(ids) // max(1, len(offsets))
    idx = torch.tensor(ids, dtype=torch.long).view(len(offsets), n_feat)   # every gap has the same feature count
    y = torch.tensor(labels)
    weights = torch.zeros(buckets, requires_grad=True)
    opt = torch.optim.Adagrad([weights], lr=0.2)
    g = torch.Generator().manual_seed(seed)
    batch = 1024
    for epoch in range(epochs):
        order = torch.randperm(len(y), generator=g)
        bar = tqdm(range(0, len(y), batch), desc=f"epoch {epoch + 1}/{epochs}", disable=not progress,
                   unit="batch", leave=False)
        total = 0.0
        for start in bar:
            b = order[start:start + batch]
            z = weights[idx[b]].sum(dim=1)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(z, y[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(b)
        print(f"epoch {epoch + 1}: {len(y):,} gaps ({int(y.sum()):,} sentence ends), log loss {total / len(y):.4f}")
    return weights.detach().tolist()


def valid_streams(data: Path, sets: list[str], src_lang: str, split: str = "valid") -> dict[str, list[list[list[str]]]]:
    """set -> its valid (or `split`) talks (the lines of one document, in file order), each a list of sentences
    (word lists), from SPLIT.SET.{de,docs}."""
    from models.sentence_boundary import SegmenterError
    out = {}
    for name in sets:
        src, doc = data / f"{split}.{name}.{src_lang}", data / f"{split}.{name}.docs"
        for p in (src, doc):
            if not p.is_file():
                raise SegmenterError(f"{p} not found: --valid-sets names valid sets of {data} (prepare-data "
                                     "writes SPLIT.NAME.docs beside them)")
        sources = src.read_text(encoding="utf-8").rstrip("\n").split("\n")
        docs = doc.read_text(encoding="utf-8").rstrip("\n").split("\n")
        if len(sources) != len(docs):
            raise SegmenterError(f"{src} has {len(sources)} lines, {doc} {len(docs)}")
        talks: dict[str, list[list[str]]] = {}
        for s, d in zip(sources, docs):
            talks.setdefault(d, []).append(s.split())
        out[name] = list(talks.values())
    return out


def choose_threshold(model, streams: dict[str, list[list[list[str]]]]) -> tuple[float, dict]:
    """The threshold with the best F1 averaged over the sets (each set weighs the same)."""
    from models.sentence_boundary import boundary_scores
    from models.sentence_cutter import cut_stream
    best = None
    for t in [x / 20 for x in range(2, 20)]:
        model.threshold = t
        scores = {name: boundary_scores(s, lambda w: cut_stream(w, model)) for name, s in streams.items()}
        mean = sum(s["f1"] for s in scores.values()) / len(scores)
        if best is None or mean > best[0]:
            best = (mean, t, scores)
    model.threshold = best[1]
    return best[1], best[2]


def run(args) -> int:
    import torch

    from models.sentence_boundary import BoundaryModel, boundary_scores
    from models.sentence_cutter import cut_stream
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    sets = [s.strip() for s in args.valid_sets.split(",") if s.strip()]
    valid = valid_streams(args.data, sets, args.src_lang)     # a missing valid set fails before training
    streams = training_streams(args.data, args.src_lang, args.max_lines)
    print("training lines: " + ", ".join(f"{k} {len(v):,}" for k, v in streams.items()))
    weights = fit(streams, args.buckets, args.epochs, args.seed, not args.no_progress)
    model = BoundaryModel(weights, 0.5, {
        "data": str(args.data), "sources": {k: len(v) for k, v in streams.items()}, "epochs": args.epochs,
        "valid_sets": sets, "seed": args.seed})
    threshold, scores = choose_threshold(model, valid)
    punct = {name: boundary_scores(s, lambda w: cut_stream(w, None))
             for name, s in valid.items()}
    model.trained_on["valid_f1"] = {k: round(v["f1"], 4) for k, v in scores.items()}
    model.save(args.out)
    print(f"threshold {threshold} (best mean F1 on the valid talks)")
    print(f"{'valid set':<12} {'sentence ends':>13} | {'punct P':>7} {'R':>6} {'F1':>6} | {'boundary P':>10} "
          f"{'R':>6} {'F1':>6}")
    for name in valid:
        p, b = punct[name], scores[name]
        print(f"{name:<12} {b['boundaries']:>13} | {p['precision']:>7.3f} {p['recall']:>6.3f} {p['f1']:>6.3f} | "
              f"{b['precision']:>10.3f} {b['recall']:>6.3f} {b['f1']:>6.3f}")
    print(json.dumps({"out": str(args.out), "threshold": threshold, "seconds": round(time.time() - t0, 1)}))
    return 0
