"""`simulserve evaluate`: BLEU–latency sweeps over checkpoints, latency settings and test sets.

For every checkpoint, every latency setting of its policy (the `--k` list for
wait-k models, the `--delta` list for GMA models, one point for offline ones)
and every test set, the sentences are translated with simulated word-by-word
streaming by `models.translate.simulate` (the project's one decoding loop) and
scored:

- BLEU with sacrebleu (corpus BLEU, `--sacrebleu-tokenizer`, default 13a);
- AL, LAAL, AP, DAL, CW in SimulEval 1.1.4's convention (source words, target
  words, AL/AP with the reference length unless `--no-use-ref-len`) -- the
  numbers `simuleval --agent agents/simuleval_agent.py` prints;
- the same metrics in the GMA paper's convention (subwords, source and target
  EOS counted, hypothesis length) -- the convention of the paper's tables.

Both come from `models/metrics/latency.py`. Writes DIR/results.json, DIR/results.csv,
DIR/bleu_al.<set>.png (one curve per policy label, offline as a point) and the
per-sentence outputs DIR/outputs/<set>/<model>.<setting>.jsonl.

`--long-form` evaluates whole talks instead (agents/longform.py): DIR/longform.json and
simulstream logs.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from agents.scoring import METRICS, score_results, setting_text
from models.errors import UserError
from models.decoding import add_decoding_arguments, decoding_options
from models.step_form import add_step_argument


class EvaluationError(UserError):
    """Bad evaluation input: files, line counts, settings, checkpoints."""


@dataclass
class TestSet:
    name: str
    source_path: Path
    reference_path: Path
    sources: list[str]
    references: list[str]


@dataclass
class Model:
    path: Path
    name: str
    label: str
    policy: str  # offline | waitk | gma
    cfg: object
    settings: list[dict] = field(default_factory=list)  # simulate() keyword arguments


# ------------------------------------------------------------------ input

def parse_list(text: str | None, cast, option: str) -> list | None:
    """"1,3,5" -> [1, 3, 5]; None stays None."""
    if text is None:
        return None
    items = [x.strip() for x in str(text).split(",")]
    if not all(items):
        raise EvaluationError(f"{option} {text!r}: empty item in the comma-separated list")
    try:
        values = [cast(x) for x in items]
    except ValueError:
        raise EvaluationError(f"{option} {text!r}: expected comma-separated "
                              f"{'integers' if cast is int else 'numbers'}") from None
    if cast is float and not all(math.isfinite(v) for v in values):
        raise EvaluationError(f"{option} {text!r}: values must be finite")
    return list(dict.fromkeys(values))  # drop repeats, keep order


def read_lines(path: Path, what: str) -> list[str]:
    """The file's lines without line ends; every line must hold some text."""
    if not path.is_file():
        raise EvaluationError(f"{what} file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise EvaluationError(f"{what} file {path} is not UTF-8: {e}") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise EvaluationError(f"{what} file {path} is empty")
    for i, line in enumerate(lines, 1):
        if not line.strip():
            raise EvaluationError(f"{what} file {path}: line {i} is empty (every line must be a "
                                  "sentence; remove the line from both files)")
    return lines


def read_test_set(source: str | Path, reference: str | Path, name: str) -> TestSet:
    src, ref = Path(source), Path(reference)
    sources, references = read_lines(src, "source"), read_lines(ref, "reference")
    if len(sources) != len(references):
        raise EvaluationError(f"line counts differ: {src} has {len(sources)} lines, "
                              f"{ref} has {len(references)}; they must be aligned line by line")
    return TestSet(name, src, ref, sources, references)


def set_name(path: Path, src_lang: str) -> str:
    name = path.name
    return name[: -len(src_lang) - 1] if name.endswith("." + src_lang) else (path.stem or name)


def data_dir_sets(data: Path, splits: list[str], names: list[str] | None,
                  src_lang: str, tgt_lang: str) -> list[tuple[str, Path, Path]]:
    """`prepare-data` layout: SPLIT.SRC/TGT (all sources) and SPLIT.NAME.SRC/TGT (per source)."""
    if not data.is_dir():
        raise EvaluationError(f"data directory not found: {data}")
    found = []
    for split in splits:
        candidates = [(split, data / f"{split}.{src_lang}")]
        for p in sorted(data.glob(f"{split}.*.{src_lang}")):
            candidates.append((p.name[: -len(src_lang) - 1], p))
        for name, src in candidates:
            ref = src.with_name(src.name[: -len(src_lang)] + tgt_lang)
            short = name[len(split) + 1:] if name != split else split
            if not src.is_file() or (names and short not in names and name not in names):
                continue
            if not ref.is_file():
                raise EvaluationError(f"{src} has no reference file {ref}")
            found.append((name, src, ref))
    if not found:
        there = sorted(set_name(p, src_lang) for p in data.glob(f"*.{src_lang}")
                       if p.with_name(p.name[: -len(src_lang)] + tgt_lang).is_file())
        sets = sorted({n.split(".", 1)[1] for n in there if "." in n and n.split(".", 1)[0] in splits})
        have = (f"its sets of {'/'.join(splits)}: {', '.join(sets)}" if sets
                else f"its splits: {', '.join(sorted({n.split('.', 1)[0] for n in there}))}" if there
                else f"it has no {src_lang}/{tgt_lang} pair of files")
        raise EvaluationError(f"no test sets in {data} for splits {splits}"
                              + (f" and sets {names}" if names else "")
                              + f" (looked for SPLIT[.NAME].{src_lang} with SPLIT[.NAME].{tgt_lang}); {have}")
    return found


def display_path(path: Path) -> str:
    """A checkpoint path for results files: relative to the working directory when inside it, so
    committed results name no machine's directories."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def model_name(path: Path) -> str:
    path = path.resolve()
    return path.parent.name if path.name == "checkpoint" and path.parent.name else path.name


def plan_models(args) -> list[Model]:
    """Resolve checkpoints and settings without loading weights (fail fast)."""
    from models.checkpoint import read_config
    from models.policies import make_policy, policy_class
    from models.shipped import resolve_checkpoint

    ks = parse_list(args.k, int, "--k")
    deltas = parse_list(args.delta, float, "--delta")
    if args.label and len(args.label) != len(args.checkpoint):
        raise EvaluationError(f"--label given {len(args.label)} times for {len(args.checkpoint)} "
                              "checkpoints: give one label per checkpoint, or none")
    given = getattr(args, "name", None)
    if given:
        if len(given) != len(args.checkpoint):
            raise EvaluationError(f"--name given {len(given)} times for {len(args.checkpoint)} checkpoints: "
                                  "give one name per checkpoint, or none")
        for n in given:
            if not n or n in (".", "..") or "/" in n or "\\" in n or n != n.strip():
                raise EvaluationError(f"--name {n!r}: a name is part of file names, so it cannot be empty, "
                                      "hold a slash or start or end with a space")
        if len(set(given)) != len(given):
            raise EvaluationError(f"--name: each checkpoint needs its own name, got {', '.join(given)}")
    models, names = [], set()
    for i, ckpt in enumerate(args.checkpoint):
        path = resolve_checkpoint(ckpt)
        cfg, _ = read_config(path)  # CheckpointError: missing dir, no config.json, bad config
        policy = cfg.policy
        settings = policy_class(cfg).sweep(cfg, ks, deltas, args.beam)
        for s in settings:
            make_policy(cfg, **s)  # PolicyError for k < 1, δ < 0, ...
        name = given[i] if given else model_name(path)
        while name in names:
            name += "'"
        names.add(name)
        models.append(Model(path, name, args.label[i] if args.label else policy, policy, cfg, settings))
    rules = [policy_class(m.cfg) for m in models]
    if ks is not None and not any(r.has_k for r in rules):
        print("warning: --k is ignored, no wait-k checkpoint is evaluated", file=sys.stderr)
    if deltas is not None and not any(r.has_delta for r in rules):
        print("warning: --delta is ignored, no GMA checkpoint is evaluated", file=sys.stderr)
    return models


def plan_sets(args, src_lang: str, tgt_lang: str) -> list[TestSet]:
    sources, references = args.source or [], args.reference or []
    if len(sources) != len(references):
        raise EvaluationError(f"{len(sources)} --source but {len(references)} --reference: "
                              "give them in pairs (--source A.de --reference A.en ...)")
    pairs = [(set_name(Path(s), src_lang), s, r) for s, r in zip(sources, references)]
    if args.data:
        splits = parse_list(args.splits, str, "--splits")
        names = parse_list(args.sets, str, "--sets")
        pairs += data_dir_sets(Path(args.data), splits, names, src_lang, tgt_lang)
    if not pairs:
        raise EvaluationError("no test set: give --source FILE --reference FILE (repeatable) "
                              "or --data DIR")
    sets, seen = [], set()
    for name, s, r in pairs:
        while name in seen:
            name += "'"
        seen.add(name)
        ts = read_test_set(s, r, name)
        if args.limit:
            ts.sources, ts.references = ts.sources[: args.limit], ts.references[: args.limit]
        sets.append(ts)
    return sets


def check_lengths(model: Model, tok, sets: list[TestSet]) -> None:
    """A sentence longer than the model's positions would stop the run halfway: check first."""
    from models.translate import source_length_error
    for ts in sets:
        for i, s in enumerate(ts.sources, 1):
            error = source_length_error(tok, model.cfg.max_positions, s)
            if error is not None:
                raise EvaluationError(f"{ts.source_path} line {i}: {error} ({model.name}): split or drop it")


# ------------------------------------------------------------------ scoring

# ------------------------------------------------------------------ output

CSV_FIELDS = (["set", "label", "model", "policy", "setting", "k", "delta", "BLEU"]
              + list(METRICS) + [f"paper_{m}" for m in METRICS]
              + ["sentences", "no_output", "compute_ms_per_sentence", "checkpoint"])


def flat(row: dict) -> dict:
    out = {k: row[k] for k in ("set", "label", "model", "policy", "setting", "k", "delta", "BLEU",
                               "sentences", "no_output", "compute_ms_per_sentence", "checkpoint")}
    out.update(row["simuleval"])
    out.update({f"paper_{m}": v for m, v in row["paper"].items()})
    return out


def format_table(rows: list[dict], use_ref_len: bool) -> str:
    ref = "reference length" if use_ref_len else "hypothesis length"
    ws = max([3] + [len(r["set"]) for r in rows])
    wm = max([5] + [len(r["model"]) for r in rows])
    wt = max([7] + [len(r["setting"]) for r in rows])
    left = f"{'set':<{ws}} {'model':<{wm}} {'setting':<{wt}} {'BLEU':>6}"
    paper = ("AL", "AP", "DAL", "CW")
    head2 = left + " | " + " ".join(f"{m:>7}" for m in METRICS) + " | " + " ".join(f"{m:>7}" for m in paper)
    head1 = " " * len(left) + f" | {'SimulEval: words, ' + ref:<39} | GMA paper: subwords + EOS"
    lines = [head1, head2, "-" * len(head2)]
    for r in rows:
        s, p = r["simuleval"], r["paper"]
        lines.append(f"{r['set']:<{ws}} {r['model']:<{wm}} {r['setting']:<{wt}} {r['BLEU']:>6.2f} | "
                     + " ".join(f"{s[m]:>7.3f}" for m in METRICS) + " | "
                     + " ".join(f"{p[m]:>7.3f}" for m in paper))
    return "\n".join(lines)


def markdown_tables(rows: list[dict], sets: list[dict]) -> str:
    """The same figures as format_table, as one markdown table per test set (docs/results.md)."""
    paper = ("AL", "AP", "DAL", "CW")
    sizes = {s["name"]: s["sentences"] for s in sets}
    out = []
    for name in dict.fromkeys(r["set"] for r in rows):
        out += [f"**{name}** ({sizes.get(name, '?')} sentences)", "",
                "| model | setting | BLEU | " + " | ".join(METRICS) + " | "
                + " | ".join(f"{m} (paper)" for m in paper) + " |",
                "|---|---|" + "---:|" * (1 + len(METRICS) + len(paper))]
        for r in (r for r in rows if r["set"] == name):
            cells = [f"{r['BLEU']:.2f}"] + [f"{r['simuleval'][m]:.2f}" for m in METRICS] \
                + [f"{r['paper'][m]:.2f}" for m in paper]
            out.append(f"| {r['label']} | {r['setting'].replace('delta=', 'δ=')} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def write_outputs(out: Path, rows: list[dict], meta: dict) -> list[Path]:
    """results.json, results.csv and one BLEU-AL plot per set in meta (after --append: the earlier sets too)."""
    from agents.plots import bleu_latency_plot

    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({**meta, "results": rows}, indent=2,
                                                 ensure_ascii=False, allow_nan=True) + "\n")
    with open(out / "results.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow(flat(r))
    pngs = []
    for ts in meta["sets"]:
        pts = [{"label": r["label"], "policy": r["policy"], "setting": r["setting"].replace("delta=", "δ="),
                "BLEU": r["BLEU"], "AL": r["simuleval"]["AL"], "paper_AL": r["paper"]["AL"]}
               for r in rows if r["set"] == ts["name"]]
        pngs.append(bleu_latency_plot(pts, out / f"bleu_al.{ts['name']}.png",
                                      title=f"{ts['name']} ({ts['sentences']} sentences)"))
    return pngs


def merge_previous(path: Path, rows: list[dict], meta: dict) -> tuple[list[dict], dict]:
    """--append: keep the rows of an earlier run in `path` that this run did not redo."""
    if not path.is_file():
        return rows, meta
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
        old_rows, old_sets = old["results"], old["sets"]
    except (ValueError, KeyError, TypeError) as e:
        raise EvaluationError(f"--append: {path} is not a results file of `evaluate` ({e})") from None
    if (old.get("use_ref_len"), old.get("sacrebleu_tokenizer")) != (meta["use_ref_len"], meta["sacrebleu_tokenizer"]):
        raise EvaluationError(f"--append: {path} was scored with other options (tokenizer or reference length)")
    sizes = {s["name"]: s["sentences"] for s in meta["sets"]}
    clash = [s["name"] for s in old_sets if s["name"] in sizes and s["sentences"] != sizes[s["name"]]]
    if clash:
        raise EvaluationError(f"--append: {path} has other sentence counts for {clash} (use the same --limit)")
    redone = {(r["set"], r["model"], r["setting"]) for r in rows}
    kept = [r for r in old_rows if (r["set"], r["model"], r["setting"]) not in redone]
    set_order = {s["name"]: i for i, s in enumerate(meta["sets"])}
    merged = sorted(kept + rows, key=lambda r: set_order.get(r["set"], len(set_order)))
    sets = meta["sets"] + [s for s in old_sets if s["name"] not in sizes]
    return merged, {**meta, "sets": sets, "seconds": round(old.get("seconds", 0) + meta["seconds"], 2)}


# ------------------------------------------------------------------ command

def register(sub) -> None:
    p = sub.add_parser(
        "evaluate", help="BLEU-latency sweep (AL/LAAL/AP/DAL/CW, both conventions) with table, JSON, CSV, plot",
        description="Translate test sets with simulated streaming and score BLEU and latency for every "
                    "checkpoint and setting.",
        epilog="examples:\n"
               "  simulserve evaluate -m gma_delta1 --data data/de-en --sets bible --long-form -o results/long\n"
               "  simulserve evaluate -m gma_delta1 --delta 0.5,1,2 --data data/de-en --sets bible -o results/gma\n"
               "  simulserve evaluate -m waitk --k 1,3,5 --source test.de --reference test.en -o results/waitk\n"
               "  simulserve evaluate -m offline --beam 5 --data data/de-en --append -o results/gma",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", "-m", action="append", required=True,
                   help="checkpoint directory or shipped model name (repeat for several)")
    p.add_argument("--label", action="append",
                   help="curve label per --checkpoint (default: its policy, so checkpoints of one "
                        "policy, e.g. one GMA model per δ, form one curve)")
    p.add_argument("--name", action="append",
                   help="the model's name in results.csv and the output files, per --checkpoint (default: its "
                        "directory's name); a candidate run under a shipped model's name pairs row by row with "
                        "that model's runs (recipes/gate_round.sh, recipes/decoding_table.py)")
    p.add_argument("--k", help="comma-separated wait-k lags for wait-k checkpoints, e.g. 1,3,5,7,9 "
                               "(default: the checkpoint's)")
    p.add_argument("--delta", help="comma-separated GMA offsets for GMA checkpoints, e.g. 0.9,1,2 "
                                   "(default: the checkpoint's)")
    p.add_argument("--beam", type=int, default=1, help="beam size for offline checkpoints")
    p.add_argument("--source", action="append", help="source sentences, one per line (repeatable)")
    p.add_argument("--reference", action="append", help="references aligned with the --source before")
    p.add_argument("--data", help="a `prepare-data` directory: evaluates SPLIT.SRC and every "
                                  "SPLIT.NAME.SRC (languages from the checkpoint)")
    p.add_argument("--splits", default="test", help="with --data: comma-separated splits (default test)")
    p.add_argument("--sets", help="with --data: only these per-source sets, e.g. bible,ddtp "
                                  "(the split's name selects the combined file)")
    p.add_argument("--limit", type=int, help="only the first N sentences of every set")
    p.add_argument("--output", "-o", required=True, help="directory for results.json/.csv and plots")
    p.add_argument("--sacrebleu-tokenizer", default="13a", help="sacrebleu tokenizer (default 13a)")
    p.add_argument("--no-use-ref-len", action="store_true",
                   help="SimulEval convention: AL/AP with the hypothesis length (as simuleval's flag)")
    p.add_argument("--batch-size", type=int, default=16, help="sentences stepped together")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32", help="float32 (default), bfloat16, float16 (CUDA)")
    add_step_argument(p)
    add_decoding_arguments(p)
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no table")
    p.add_argument("--append", action="store_true",
                   help="merge into OUTPUT/results.json of an earlier run (its other models stay, the "
                        "plots show all); rows of the same set, model and setting are replaced")
    g = p.add_argument_group("long form (whole talks, docs/evaluation.md)")
    g.add_argument("--long-form", action="store_true",
                   help="stream each talk (a document of the test set: SPLIT[.NAME].docs) word by word with no "
                        "sentence ends, let --segmenter end sentences, re-align the output to the references "
                        "with mweralign; BLEU and StreamLAAL beside the per-sentence figures")
    g.add_argument("--segmenter", default="punct,punct+max:30",
                   help="comma-separated: punct (the server's auto_segment), punct+max:N (or N words), "
                        "boundary and boundary+max:N (punctuation or the sentence-boundary classifier, one word "
                        "on), fixed:N, oracle (the reference ends) (default punct,punct+max:30)")
    g.add_argument("--boundary-model", metavar="DIR",
                   help="the sentence-boundary classifier for boundary segmenters (default: the shipped one; "
                        "`simulserve train-segmenter` writes one)")
    g.add_argument("--wpm", type=float, default=150.0, help="speaker's pace, words per minute (default 150)")
    g.add_argument("--min-talk-words", type=int, default=100, help="shorter talks are left out (default 100)")
    g.add_argument("--talks", type=int, help="only the first N talks of every set")
    p.set_defaults(func=run)


def run(args) -> int:
    import torch
    from tqdm import tqdm

    from models.checkpoint import load_checkpoint, pick_device, pick_dtype
    from models.step import StreamingDecoder
    from models.translate import simulate

    if args.limit is not None and args.limit < 1:
        raise EvaluationError("--limit must be >= 1")
    if args.batch_size < 1:
        raise EvaluationError("--batch-size must be >= 1")
    try:
        import sacrebleu
        sacrebleu.BLEU(tokenize=args.sacrebleu_tokenizer)
    except Exception as e:  # sacrebleu raises several types for an unknown tokenizer
        raise EvaluationError(f"--sacrebleu-tokenizer {args.sacrebleu_tokenizer!r}: {e}") from None
    if args.threads:
        torch.set_num_threads(args.threads)
    models = plan_models(args)
    langs = {(m.cfg.src_lang, m.cfg.tgt_lang) for m in models}
    if args.data and len(langs) > 1:
        raise EvaluationError(f"--data needs checkpoints of one language pair, got {sorted(langs)}")
    src_lang, tgt_lang = next(iter(langs))
    sets = plan_sets(args, src_lang, tgt_lang)
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    options = decoding_options(args)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    if args.long_form:
        from agents.longform import evaluate_long_form
        evaluate_long_form(args, models, sets, device, dtype, out)
        return 0

    total = sum(len(m.settings) for m in models) * sum(len(ts.sources) for ts in sets)
    rows = []
    started = time.time()
    with tqdm(total=total, unit="sent", disable=args.quiet, file=sys.stderr, dynamic_ncols=True) as bar:
        for m in models:
            model, tok, _ = load_checkpoint(m.path, device, dtype)
            check_lengths(m, tok, sets)
            decoder = StreamingDecoder(model, tok, form=args.step, options=options)
            for setting in m.settings:
                text = setting_text(setting)
                for ts in sets:
                    bar.set_description(f"{ts.name} {m.name} {text}")
                    results = simulate(decoder, ts.sources, batch_size=args.batch_size, progress=bar,
                                       **setting)
                    scores = score_results(results, ts.references, args.sacrebleu_tokenizer,
                                           not args.no_use_ref_len)
                    rows.append({"set": ts.name, "label": m.label, "model": m.name, "policy": m.policy,
                                 "setting": text, "k": setting.get("k"), "delta": setting.get("delta"),
                                 "beam": setting.get("beam"), "checkpoint": display_path(m.path), **scores})
                    detail = out / "outputs" / ts.name / f"{m.name}.{text.replace(' ', '_')}.jsonl"
                    detail.parent.mkdir(parents=True, exist_ok=True)
                    with open(detail, "w", encoding="utf-8") as f:
                        for r, ref in zip(results, ts.references):
                            f.write(json.dumps({**json.loads(r.to_json()), "reference": ref},
                                               ensure_ascii=False) + "\n")
            del decoder, model
    set_order = {ts.name: i for i, ts in enumerate(sets)}
    rows.sort(key=lambda r: set_order[r["set"]])  # stable: models and settings keep their order
    meta = {
        "step_form": args.step, "decoding": dataclasses.asdict(options),
        "conventions": {
            "simuleval": "SimulEval 1.1.4: source words, detokenised target words, no EOS; AL/AP use "
                         + ("the reference length" if not args.no_use_ref_len else "the hypothesis length")
                         + ", DAL the hypothesis length, LAAL max(hypothesis, reference); sentences "
                           "without output are left out (counted in no_output)",
            "paper": "GMA paper: source subwords + EOS, target subwords + EOS, hypothesis length",
        },
        "sets": [{"name": ts.name, "source": str(ts.source_path), "reference": str(ts.reference_path),
                  "sentences": len(ts.sources)} for ts in sets],
        "sacrebleu_tokenizer": args.sacrebleu_tokenizer,
        "use_ref_len": not args.no_use_ref_len,
        "device": str(device),
        "dtype": args.dtype,
        "seconds": round(time.time() - started, 2),
    }
    if args.append:
        rows, meta = merge_previous(out / "results.json", rows, meta)
    pngs = write_outputs(out, rows, meta)
    if not args.quiet:
        print(format_table(rows, not args.no_use_ref_len))
        print(f"\nwrote {out / 'results.json'}, {out / 'results.csv'}, "
              + ", ".join(str(p) for p in pngs))
    return 0
