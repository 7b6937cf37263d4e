"""Clean, filter, split and write the corpora; train the vocabulary; write the manifest.

`build(corpus, out, ...)` takes already-extracted pairs ({source: [Pair]}),
so tests and users' own files go through exactly the code path the package
corpora take. Fetching lives in cli.py / fetch.py.
"""
from __future__ import annotations

import json
import random
import re
import shutil
import time
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from . import Pair, vocab
from .normalize import clean, reject_reason

SPLITS = ("train", "valid", "test")
MANIFEST = "manifest.json"
FORMAT = 1
FORCED = ("=valid", "=test")   # group names that pin pairs to a split (user's own dev/test files)
# evaluation sets that pool several sources' valid/test pairs (VALID|TEST.NAME.de/en)
EVAL_SETS = {"everyday": ("auf-deutsch",), "dialogue": ("freedroid", "hedgewars", "wesnoth"),
             "unseen": ("naev", "tuxpaint")}
# Test-only sources: every pair goes to the pooled `unseen` test set and nowhere
# else (no train, valid or per-source files), after its German (`leak_key`) is
# checked against every other source's train, valid and test sentences. They
# come last everywhere, so adding them changes no other file.
TEST_ONLY = EVAL_SETS["unseen"]
# Sources added after the shipped models' valid/test sets were fixed. They are
# deduplicated and held out after all the others (see `source_order`), so adding
# them removes pairs from no older source's valid or test set, only from train.
LATE_SOURCES = ("openclonk", "scummvm")
# Train-only sources: every pair goes to train (no valid/test of their own). They
# come after everything, the test-only sources included, and lose each pair whose
# German (`leak_key`) is in any valid or test set, so adding them changes no
# evaluation file and takes no pair from the unseen set.
TRAIN_ONLY = ("widelands",)


def source_order(sources) -> list[str]:
    """Sorted names, the late sources last: the order in which sources claim
    pairs (the cross-source duplicate filter keeps a pair in the first source,
    and a German sentence held out for an earlier source leaves a later one)."""
    return sorted(sources, key=lambda s: (s in TRAIN_ONLY, s in TEST_ONLY, s in LATE_SOURCES, s))


def filter_pairs(pairs: list[Pair], seen: set[tuple[str, str]]) -> tuple[list[Pair], Counter]:
    """Normalise, drop bad pairs and exact duplicates (across sources via `seen`)."""
    kept, dropped = [], Counter()
    for p in pairs:
        de, en = clean(p.de), clean(p.en)
        reason = reject_reason(de, en)
        if reason is None and (de, en) in seen:
            reason = "duplicate"
        if reason:
            dropped[reason] += 1
            continue
        seen.add((de, en))
        kept.append(p._replace(de=de, en=en))
    return kept, dropped


def assign_groups(pairs: list[Pair], rng: random.Random, eval_size: int) -> dict[str, str]:
    """{group: split}. Whole groups go to test, then valid, until each holds
    about `eval_size` evaluable pairs (at most 10% of the source each)."""
    counts = Counter(p.group for p in pairs if p.eval_ok)
    assign = {g: g.split(":", 1)[0][1:] for g in counts if g.startswith(FORCED)}
    forced = set(assign.values())
    groups = sorted({p.group for p in pairs} - set(assign))
    rng.shuffle(groups)
    target = min(eval_size, max(1, sum(counts[g] for g in groups) // 10))
    for split in ("test", "valid"):
        if split in forced:
            continue
        taken = 0
        for g in groups:
            if taken >= target:
                break
            # skip groups that would overshoot a lot (e.g. the Psalms)
            if g not in assign and counts[g] and taken + counts[g] <= 1.5 * target:
                assign[g] = split
                taken += counts[g]
        if taken == 0:  # every group is big: take the smallest evaluable one
            free = sorted((counts[g], g) for g in groups if g not in assign and counts[g])
            if free:
                assign[free[0][1]] = split
    return {g: assign.get(g, "train") for g in {p.group for p in pairs}}


def split_corpus(corpus: dict[str, list[Pair]], seed: int, eval_size: int
                 ) -> dict[str, dict[str, list[Pair]]]:
    """{split: {source: pairs}} with no German sentence shared between splits.

    Evaluation sets keep one copy of each German sentence and only `eval_ok`
    pairs (no paraphrase copies); train loses every pair whose German side is
    in valid or test (compared by `leak_key`), whichever source it came from.
    """
    out: dict[str, dict[str, list[Pair]]] = {s: {} for s in SPLITS}
    for source in source_order(corpus):
        if source in TEST_ONLY:
            continue
        if source in TRAIN_ONLY:
            out["train"][source] = list(corpus[source])
            continue
        rng = random.Random("%d:%s" % (seed, source))
        assign = assign_groups(corpus[source], rng, eval_size)
        for split in SPLITS:
            out[split][source] = [p for p in corpus[source] if assign[p.group] == split
                                  and (split == "train" or p.eval_ok)]
    held: set[str] = set()
    # older sources first (test, then valid), then the late ones: what the older
    # sets held out before a late source existed stays exactly as it was
    order = [s for s in source_order(corpus) if s not in TEST_ONLY and s not in TRAIN_ONLY]
    tiers = [[s for s in order if s not in LATE_SOURCES], [s for s in order if s in LATE_SOURCES]]
    for tier, split in ((t, s) for t in tiers for s in ("test", "valid")):
        for source in tier:
            pairs = out[split][source]
            unique = []
            for p in pairs:
                key = leak_key(p.de)
                if key not in held:
                    held.add(key)
                    unique.append(p)
            out[split][source] = unique
    for source, pairs in out["train"].items():
        out["train"][source] = [p for p in pairs if leak_key(p.de) not in held]
    held |= {leak_key(p.de) for source, pairs in out["train"].items() if source not in TRAIN_ONLY for p in pairs}
    for source in (s for s in source_order(corpus) if s in TEST_ONLY):
        out["test"][source] = unique = []
        for p in corpus[source]:
            key = leak_key(p.de)
            if p.eval_ok and key not in held:
                held.add(key)
                unique.append(p)
    unseen = {leak_key(p.de) for source in TEST_ONLY for p in out["test"].get(source, [])}
    for source in (s for s in out["train"] if s in TRAIN_ONLY):
        out["train"][source] = [p for p in out["train"][source] if leak_key(p.de) not in unseen]
    return out


_NON_WORD = re.compile(r"\W+")


def leak_key(de: str) -> str:
    """German sentence as compared across splits: case, punctuation and spacing
    ignored, so "Optionen" in test also keeps "Optionen:" out of train."""
    return _NON_WORD.sub(" ", de.lower()).strip()


def _write_lines(path: Path, lines) -> None:
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
    tmp.replace(path)


def write_splits(splits: dict[str, dict[str, list[Pair]]], out: Path, seed: int) -> list[str]:
    """Joint files per split (train shuffled, so sources mix) plus per-source valid/test."""
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for split in SPLITS:
        # late sources last, so the joint valid/test files of the older ones stay a prefix
        pairs = [p for source in source_order(splits[split]) if source not in TEST_ONLY
                 for p in splits[split][source]]
        if split == "train":
            random.Random(seed).shuffle(pairs)
        for lang in ("de", "en"):
            name = "%s.%s" % (split, lang)
            _write_lines(out / name, (getattr(p, lang) for p in pairs))
            files.append(name)
        if split != "train":
            # which document each line comes from: long-form evaluation joins a document's lines into a talk
            name = "%s.docs" % split
            _write_lines(out / name, (doc_id(p) for p in pairs))
            files.append(name)
        # per source (train too: recipes oversample small sources from these)
        for source, spairs in sorted(splits[split].items()):
            if source in TEST_ONLY:
                continue
            for lang in ("de", "en"):
                name = "%s.%s.%s" % (split, source, lang)
                _write_lines(out / name, (getattr(p, lang) for p in spairs))
                files.append(name)
            if split != "train":
                name = "%s.%s.docs" % (split, source)
                _write_lines(out / name, (doc_id(p) for p in spairs))
                files.append(name)
        if split != "train":
            for set_name, members in EVAL_SETS.items():
                if set_name in splits[split] or not any(m in splits[split] for m in members):
                    continue
                pooled = [p for m in members for p in splits[split].get(m, [])]
                for lang in ("de", "en"):
                    name = "%s.%s.%s" % (split, set_name, lang)
                    _write_lines(out / name, (getattr(p, lang) for p in pooled))
                    files.append(name)
                name = "%s.%s.docs" % (split, set_name)
                _write_lines(out / name, (doc_id(p) for p in pooled))
                files.append(name)
    return files


def doc_id(p: Pair) -> str:
    """The document a pair comes from (a Bible chapter, a help page, a game's dialogue file)."""
    return p.doc or p.group


def build(corpus: dict[str, list[Pair]], out: Path, *, seed: int = 1, eval_size: int = 600,
          vocab_size: int = 8000, options: dict | None = None, packages: dict | None = None,
          hard_vocab_limit: bool = True, vocab_from: Path | None = None) -> dict:
    """The whole offline pipeline; returns (and writes) the manifest."""
    start = time.time()
    out = Path(out)
    seen: set[tuple[str, str]] = set()
    clean_corpus, dropped = {}, {}
    for source in source_order(corpus):
        pairs = corpus[source]
        clean_corpus[source], dropped[source] = filter_pairs(
            tqdm(pairs, desc="filter " + source, unit="pair", mininterval=2, leave=False), seen)
    splits = split_corpus(clean_corpus, seed, eval_size)
    files = write_splits(splits, out, seed)
    if vocab_from is not None:
        # fine-tuning keeps the vocabulary the weights were trained with
        shutil.copyfile(vocab_from, out / "spm.model")
        vocab_size = vocab.size(out / "spm.model")
        files += ["spm.model"]
    else:
        print("training SentencePiece (vocab %d) ..." % vocab_size, flush=True)
        vocab.train([out / "train.de", out / "train.en"], out / "spm", vocab_size, seed=seed,
                    hard_vocab_limit=hard_vocab_limit)
        files += ["spm.model", "spm.vocab"]
    counts = {src: {s: len(splits[s].get(src, [])) for s in SPLITS} for src in sorted(corpus)}
    counts["total"] = {s: sum(c[s] for c in counts.values()) for s in SPLITS}
    manifest = {
        "format": FORMAT,
        "options": options or {"seed": seed, "eval_size": eval_size, "vocab_size": vocab_size},
        "seed": seed,
        "packages": packages or {},
        "counts": counts,
        "extracted": {src: len(p) for src, p in corpus.items()},
        "dropped": {src: dict(sorted(d.items())) for src, d in dropped.items()},
        "vocab": {"model": "spm.model", "vocab_size": vocab_size, "model_type": "unigram",
                  "normalization": "nmt_nfkc", **vocab.SPECIAL_IDS,
                  **({"copied_from": str(vocab_from)} if vocab_from else {})},
        "eval_sets": {name: [m for m in members if m in clean_corpus]
                      for name, members in EVAL_SETS.items() if any(m in clean_corpus for m in members)},
        "files": files,
        "seconds": round(time.time() - start, 1),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return manifest


def up_to_date(out: Path, options: dict) -> dict | None:
    """The existing manifest if it was made with these options and all files exist."""
    try:
        manifest = json.loads((Path(out) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("format") != FORMAT or manifest.get("options") != options:
        return None
    if not all((Path(out) / f).exists() for f in manifest.get("files", [])):
        return None
    return manifest


def format_counts(manifest: dict) -> str:
    rows = [("source", *SPLITS)]
    rows += [(src, *(str(c[s]) for s in SPLITS)) for src, c in manifest["counts"].items()]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)
