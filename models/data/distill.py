"""Sequence-level knowledge distillation data: an offline teacher translates the training German.

Simultaneous students learn more easily from a teacher's translations than
from free human ones (fewer long-range reorderings, one consistent style).
`python -m models.data.distill --teacher models/checkpoints/offline --data DATA --out OUT`
writes OUT as a `prepare-data` directory a training recipe can point at:

    train.de / train.en        the training pairs with the teacher's English
                               (and, with --with-references, the human pairs too)
    train.SOURCE.de / .en      the same per source, so `oversample:` still works
    valid.* / test.*, spm.model copied from DATA: evaluation stays on human references
    distill.SOURCE.en          the teacher's output, one line per German line of
                               DATA/train.SOURCE.de (kept: an interrupted run resumes)
    manifest.json              DATA's manifest plus what the teacher did and how fast
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from tqdm import tqdm

from models.errors import UserError
from models.policies import policy_class

CHUNK = 64   # sentences translated between two appends to the distill file


def sources_of(data: Path) -> list[str]:
    """The sources DATA has per-source training files for (prepare-data writes them)."""
    names = sorted(p.name[len("train."):-len(".de")] for p in data.glob("train.*.de"))
    if not names:
        raise UserError(f"{data}: no train.SOURCE.de files; rebuild it with this version of prepare-data")
    return names


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def translate_source(decoder, german: list[str], out_file: Path, *, beam: int, batch_size: int,
                     progress: bool = True) -> tuple[int, float]:
    """Append the teacher's translations of `german` to out_file, skipping lines
    it already holds (resume). Returns (sentences translated now, seconds)."""
    from models.translate import simulate
    done = len(_lines(out_file))
    if done > len(german):
        raise UserError(f"{out_file} has more lines ({done}) than its German side ({len(german)}): delete it")
    start = time.perf_counter()
    todo = german[done:]
    with tqdm(total=len(german), initial=done, unit="sent", desc=out_file.name, disable=not progress,
              mininterval=5) as bar, open(out_file, "a", encoding="utf-8") as f:
        for i in range(0, len(todo), CHUNK):
            results = simulate(decoder, todo[i:i + CHUNK], beam=beam, whole_sentence=True,
                               batch_size=batch_size)
            # one line each, even when the teacher outputs nothing or a line break
            f.write("".join(" ".join(r.prediction.split()) + "\n" for r in results))
            f.flush()
            bar.update(len(results))
    return len(todo), time.perf_counter() - start


def distill(teacher: str | Path, data: str | Path, out: str | Path, *, sources: list[str] | None = None,
            beam: int = 5, with_references: bool = False, limit: int | None = None,
            batch_size: int = 16, device: str = "auto", progress: bool = True,
            keep_other_sources: bool = False) -> dict:
    """Build OUT from DATA with the teacher's translations; returns the manifest written."""
    from models.checkpoint import load_checkpoint, pick_device
    from models.shipped import resolve_checkpoint
    from models.step import StreamingDecoder
    from models.tokenizer import Tokenizer, vocabulary_difference
    from models.training.data_loading import read_parallel

    data, out = Path(data), Path(out)
    if out.resolve() == data.resolve():
        raise UserError("--out must differ from --data (the human references are needed)")
    known = sources_of(data)
    sources = sources or known
    unknown = sorted(set(sources) - set(known))
    if unknown:
        raise UserError(f"no training files for {unknown} in {data} (it has {known})")
    model, tok, info = load_checkpoint(resolve_checkpoint(str(teacher)), pick_device(device))
    if policy_class(model.cfg).streams:
        raise UserError(f"the teacher must be an offline model; {teacher} is a {model.cfg.attention} model")
    why = vocabulary_difference(tok, Tokenizer(data / "spm.model"))
    if why:
        raise UserError(f"{teacher} uses another vocabulary than {data}/spm.model ({why}): the students "
                        f"would not understand its token ids")
    decoder = StreamingDecoder(model, tok)
    out.mkdir(parents=True, exist_ok=True)
    stats, pairs = {}, {}
    for source in sources:
        de = _lines(data / f"train.{source}.de")[:limit]
        en = _lines(data / f"train.{source}.en")[:limit]
        n, secs = translate_source(decoder, de, out / f"distill.{source}.en", beam=beam,
                                   batch_size=batch_size, progress=progress)
        hyp = _lines(out / f"distill.{source}.en")
        # empty teacher outputs teach nothing: drop them
        kept = [(d, h) for d, h in zip(de, hyp) if h.strip()]
        pairs[source] = kept + (list(zip(de, en)) if with_references else [])
        stats[source] = {"sentences": len(de), "translated_now": n, "seconds_now": round(secs, 1),
                         "sentences_per_second": round(n / secs, 2) if n and secs > 0 else None,
                         "empty_outputs": len(de) - len(kept)}
    if keep_other_sources:   # the sources not distilled train on their human pairs, unchanged
        for source in known:
            if source not in sources:
                pairs[source] = read_parallel(data / f"train.{source}", "de", "en")
    _write_dataset(data, out, pairs)
    manifest = json.loads((data / "manifest.json").read_text()) if (data / "manifest.json").exists() else {}
    manifest["distillation"] = {"teacher": str(teacher), "teacher_steps": info.get("steps"), "beam": beam,
                                "with_references": with_references, "limit": limit, "sources": stats,
                                "kept_human": sorted(set(pairs) - set(sources))}
    manifest["counts"] = {s: {"train": len(p)} for s, p in pairs.items()}
    manifest["files"] = sorted(p.name for p in out.iterdir() if p.is_file() and p.name != "manifest.json")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return manifest


def _write_dataset(data: Path, out: Path, pairs: dict[str, list[tuple[str, str]]]) -> None:
    for source, ps in pairs.items():
        for i, lang in enumerate(("de", "en")):
            (out / f"train.{source}.{lang}").write_text("".join(p[i] + "\n" for p in ps), encoding="utf-8")
    joint = [p for source in sorted(pairs) for p in pairs[source]]
    for i, lang in enumerate(("de", "en")):
        (out / f"train.{lang}").write_text("".join(p[i] + "\n" for p in joint), encoding="utf-8")
    for f in data.iterdir():   # evaluation sets and the vocabulary stay the human ones
        if f.is_file() and (f.name.startswith(("valid.", "test.")) or f.name.startswith("spm.")):
            shutil.copyfile(f, out / f.name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m models.data.distill", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--teacher", default="offline", help="offline checkpoint directory or shipped name")
    p.add_argument("--data", required=True, type=Path, help="a prepare-data directory")
    p.add_argument("--out", required=True, type=Path, help="output directory (a new prepare-data directory)")
    p.add_argument("--sources", help="comma list of sources to translate (default: all of DATA's)")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--with-references", action="store_true",
                   help="keep the human pairs beside the teacher's (default: teacher outputs only)")
    p.add_argument("--keep-other-sources", action="store_true",
                   help="the sources not in --sources keep their human training pairs (default: left out)")
    p.add_argument("--limit", type=int, help="only the first N training pairs of each source")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    try:
        manifest = distill(args.teacher, args.data, args.out,
                           sources=args.sources.split(",") if args.sources else None, beam=args.beam,
                           with_references=args.with_references, limit=args.limit,
                           batch_size=args.batch_size, device=args.device, progress=not args.no_progress,
                           keep_other_sources=args.keep_other_sources)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for source, s in manifest["distillation"]["sources"].items():
        rate = s["sentences_per_second"]
        print(f"{source}: {s['sentences']} sentences, {s['translated_now']} translated now in "
              f"{s['seconds_now']} s ({rate if rate is not None else '-'} sentences/s), "
              f"{s['empty_outputs']} empty outputs")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
