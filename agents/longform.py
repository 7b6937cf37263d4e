"""`simulserve evaluate --long-form`: whole talks streamed with no sentence ends, scored like simulstream.

Every talk (agents/talks.py) is one unbounded stream of source words arriving
at a speaker's pace (`--wpm`); a segmenter decides where the server ends a
sentence; each segment is translated by `models.translate.simulate` (the
project's one decoding loop) and its steps are put on the talk's clock:

- ideal time of a target word: when the source words it had read had been
  spoken (word i of the talk, 0-based, has been heard at (i+1)·60/wpm s); kept
  as a count of source words, so StreamLAAL in words is exact arithmetic;
- computation-aware time: one model serves the talk; a step starts when its
  input has arrived and the previous step is over, and lasts the compute the
  decoder measured for it (its share of the batched step, as the server's
  compute_ms).

The whole output of a talk is then re-aligned to its reference sentences with a
minimum-WER alignment (`mweralign`, as simulstream's scorers do) and scored:
BLEU on the re-aligned lines, StreamLAAL (models/metrics/latency.py) ideal and
computation-aware, in seconds and in source words (seconds / word duration),
next to the per-sentence BLEU, AL and LAAL of the same sentences. The outputs
are also written as simulstream logs (`write_simulstream_logs`) so that
`simulstream_score_latency --scorer stream_laal` and `simulstream_score_quality
--scorer sacrebleu` can score them.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from agents.talks import Talk, TalkError


@dataclass
class TalkOutput:
    talk: Talk
    segments: list[int]                              # segment lengths the segmenter cut (source words)
    words: list[str] = field(default_factory=list)   # target words in emission order
    ideal: list[int] = field(default_factory=list)    # source words heard (talk position), speaker's clock
    aware: list[float] = field(default_factory=list)  # seconds, computation-aware
    compute_s: float = 0.0


def stream_talks(decoder, talks: list[Talk], segmenter, setting: dict, *, seconds_per_word: float,
                 batch_size: int = 16, progress=None) -> list[TalkOutput]:
    """Translate every talk as one stream cut by `segmenter`; time-stamp every target word."""
    from models.translate import simulate

    outputs, segments, where = [], [], []
    for ti, talk in enumerate(talks):
        words = talk.words
        # (cut where the model's positions would overflow too, with the EOS: as the server's auto_segment)
        cuts = segmenter(talk, decoder.tok.encode_word, decoder.cfg.max_positions - 1)
        if sum(n for n, _ in cuts) != len(words) or min(n for n, _ in cuts) < 1 or min(w for _, w in cuts) < 0:
            raise TalkError(f"segmenter cut {talk.name} into {cuts}, which does not cover its {len(words)} words")
        outputs.append(TalkOutput(talk, [n for n, _ in cuts]))
        start = 0
        for n, wait in cuts:
            segments.append(" ".join(words[start:start + n]))
            # the end of a segment is known once `wait` more words have been heard (never past the talk's end)
            where.append((ti, start, min(wait, len(words) - start - n)))
            start += n
    results = simulate(decoder, segments, batch_size=batch_size, progress=progress, steps=True, **setting)
    clocks = [0.0] * len(talks)
    for (ti, start, wait), r in zip(where, results):   # segments come in talk order
        out, spw = outputs[ti], seconds_per_word
        words = r.prediction.split()
        if len(words) != len(r.delays):
            raise RuntimeError(f"{len(words)} words but {len(r.delays)} delays in {r.prediction!r}")
        released = 0
        for pushed, ended, compute, n_out in r.steps:
            # the step's input is complete when its last pushed word has been spoken, or, for the step that
            # received the end of the segment, when the words its end waited for have
            heard = start + pushed + (wait if ended else 0)
            clocks[ti] = max(clocks[ti], heard * spw) + compute
            out.compute_s += compute
            for j in range(released, n_out):
                out.words.append(words[j])
                out.ideal.append(start + r.delays[j] + (wait if ended else 0))
                out.aware.append(clocks[ti])
            released = n_out
    return outputs


def output_from_stream(talk: Talk, words: list[dict], sentences: list[dict], boundary: bool = False) -> TalkOutput:
    """A talk's TalkOutput from a live server's `word` and `sentence` messages (`simulserve stream`):
    the server's sentence k starts where its earlier sentences' words (read and unread) end; the
    computation-aware time is when the client received the word, on the speaker's clock. With the
    `boundary` segmenter a sentence that does not end in . ! ? (and is not the talk's last) was ended by
    the classifier when the next word arrived: its words written after the end wait one word more, as in
    `stream_talks`."""
    from models.sentence_boundary import ends_sentence
    offsets, waits, at = {}, {}, 0
    talk_words = talk.words
    for s in sorted(sentences, key=lambda m: m["sentence"]):
        offsets[s["sentence"]] = at
        at += s["source_words"] + s["unread_words"]
        waits[s["sentence"]] = int(boundary and 0 < at < len(talk_words) and not ends_sentence(talk_words[at - 1]))
    out = TalkOutput(talk, [s["source_words"] + s["unread_words"] for s in sentences])
    for w in words:
        out.words.append(w["text"])
        wait = waits[w["sentence"]] if w["source_complete"] else 0
        out.ideal.append(offsets[w["sentence"]] + w["delay"] + wait)
        out.aware.append(w["received_s"])
    out.compute_s = sum(s["compute_ms"] for s in sentences) / 1000
    return out


# ------------------------------------------------------------------ re-alignment and scores

@contextlib.contextmanager
def _quiet_fds():
    """mweralign's C++ core prints progress to the process's stdout/stderr: keep tables clean."""
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def realign(references: list[str], words: list[str]) -> list[list[int]]:
    """Indices of the hypothesis words that the minimum-WER alignment gives to each reference sentence."""
    from mweralign import mweralign

    if not words:
        return [[] for _ in references]
    with _quiet_fds():
        lines = mweralign.align_texts("\n".join(references), " ".join(words)).split("\n")
    if len(lines) != len(references):
        raise RuntimeError(f"mweralign returned {len(lines)} lines for {len(references)} references")
    out, i = [], 0
    for line in lines:
        n = len([w for w in line.split(" ") if w])
        out.append(list(range(i, i + n)))
        i += n
    if i != len(words):
        raise RuntimeError(f"mweralign's lines hold {i} words, the hypothesis {len(words)}")
    return out


def score_talks(outputs: list[TalkOutput], seconds_per_word: float, tokenize: str = "13a") -> dict:
    """BLEU on the re-aligned output and StreamLAAL (ideal and computation-aware) over all talks' sentences."""
    import sacrebleu

    from models.metrics.latency import stream_laal_sentence

    hyps, refs, ideal, ideal_s, aware, empty = [], [], [], [], [], 0
    for out in outputs:
        talk, start = out.talk, 0
        for ref, idx, n in zip(talk.references, realign(talk.references, out.words), talk.sentence_lengths):
            hyps.append(" ".join(out.words[i] for i in idx))
            refs.append(ref)
            offset, duration = start * seconds_per_word, n * seconds_per_word
            if idx:
                ref_len = len(ref.split())
                ideal.append(stream_laal_sentence([out.ideal[i] for i in idx], start, n, ref_len))
                # in seconds as simulstream computes it from the logs (the same to rounding, except where
                # a rounded delay lands on the other side of the sentence's end)
                ideal_s.append(stream_laal_sentence([out.ideal[i] * seconds_per_word for i in idx], offset,
                                                    duration, ref_len))
                aware.append(stream_laal_sentence([out.aware[i] for i in idx], offset, duration, ref_len))
            else:
                empty += 1
            start += n
    metric = sacrebleu.BLEU(tokenize=tokenize)
    nan = math.nan
    mean = lambda xs: statistics.mean(xs) if xs else nan  # noqa: E731
    return {
        "BLEU": metric.corpus_score(hyps, [refs]).score,
        "StreamLAAL_s": mean(ideal_s), "StreamLAAL_CA_s": mean(aware),
        "StreamLAAL": mean(ideal), "StreamLAAL_CA": mean(aware) / seconds_per_word,
        "talks": len(outputs), "sentences": len(refs), "segments": sum(len(o.segments) for o in outputs),
        "sentences_without_words": empty,
        "compute_s": sum(o.compute_s for o in outputs),
        "realigned": hyps,
    }


# ------------------------------------------------------------------ simulstream's log format

def write_simulstream_logs(outputs: list[TalkOutput], seconds_per_word: float, out: Path) -> dict[str, Path]:
    """The files simulstream's scorers read: log.jsonl (one stream per talk, `metadata.wav_name` naming
    it; one line per target word with `total_audio_processed` = its ideal time on the speaker's clock and
    `computation_time` = computation-aware time - ideal time, so their sum is the computation-aware
    time), audio_definition.yaml (per reference sentence: wav, offset, duration in seconds),
    reference.txt (the references, line by line) and eval_config.yaml (word units, words joined by
    spaces). A text stream fits: simulstream only needs seconds, and ours are the speaker's seconds."""
    out.mkdir(parents=True, exist_ok=True)
    log, definition, references = [], [], []
    for n, o in enumerate(outputs):
        wav = f"talk{n:04d}.wav"
        log.append({"id": n, "metadata": {"wav_name": wav, "talk": o.talk.name}})
        for word, heard, aware in zip(o.words, o.ideal, o.aware):
            ideal = heard * seconds_per_word
            log.append({"id": n, "total_audio_processed": ideal, "computation_time": aware - ideal,
                        "generated_tokens": [word], "deleted_tokens": []})
        start = 0
        for ref, length in zip(o.talk.references, o.talk.sentence_lengths):
            definition.append({"wav": wav, "offset": start * seconds_per_word,
                               "duration": length * seconds_per_word})
            references.append(ref)
            start += length
    files = {"log": out / "log.jsonl", "audio_definition": out / "audio_definition.yaml",
             "reference": out / "reference.txt", "eval_config": out / "eval_config.yaml"}
    files["log"].write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in log), encoding="utf-8")
    # YAML is a superset of JSON: one flow mapping per line needs no YAML writer
    files["audio_definition"].write_text("".join("- " + json.dumps(d) + "\n" for d in definition))
    files["reference"].write_text("".join(r + "\n" for r in references), encoding="utf-8")
    files["eval_config"].write_text("detokenizer_type: simuleval\nlatency_unit: word\n")
    return files


def simulstream_commands(files: dict[str, Path]) -> list[list[str]]:
    """The two scorer command lines of simulstream 1.0.0 for these files."""
    common = ["--eval-config", str(files["eval_config"]), "--log-file", str(files["log"]),
              "--audio-definition", str(files["audio_definition"])]
    return [["simulstream_score_latency", *common, "--reference", str(files["reference"]),
             "--scorer", "stream_laal"],
            ["simulstream_score_quality", *common, "--references", str(files["reference"]),
             "--scorer", "sacrebleu"]]


# ------------------------------------------------------------------ the command (from `evaluate --long-form`)

def plan_talks(sets, src_lang: str, min_words: int, limit: int | None) -> list[Talk]:
    from agents.talks import docs_path, group_talks, read_docs

    talks = []
    for ts in sets:
        docs = read_docs(docs_path(ts.source_path, src_lang))[: len(ts.sources)]
        found = group_talks(ts.name, ts.sources, ts.references, docs, min_words)
        talks += found[:limit] if limit else found
    if not talks:
        raise TalkError(f"no talk of at least {min_words} source words in {', '.join(ts.name for ts in sets)}")
    return talks


def row_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "=.+-" else "_" for c in text)


def evaluate_long_form(args, models, sets, device, dtype, out: Path) -> list[dict]:
    """Per checkpoint, setting, set and segmenter: long-form and per-sentence figures of the same sentences."""
    import time

    from tqdm import tqdm

    from agents.scoring import score_results, setting_text
    from agents.talks import parse_segmenter
    from models.checkpoint import load_checkpoint
    from models.step import StreamingDecoder
    from models.translate import simulate

    if args.wpm <= 0:
        raise TalkError("--wpm must be > 0: the speaker's clock needs a pace")
    spw = 60.0 / args.wpm
    segmenters = [(s.strip(), parse_segmenter(s, getattr(args, "boundary_model", None)))
                  for s in args.segmenter.split(",") if s.strip()]
    if not segmenters:
        raise TalkError("--segmenter: give at least one")
    src_lang = models[0].cfg.src_lang
    talks = plan_talks(sets, src_lang, args.min_talk_words, args.talks)
    by_set = {ts.name: [t for t in talks if t.set == ts.name] for ts in sets}
    by_set = {k: v for k, v in by_set.items() if v}
    n_sent = sum(len(t.sources) for t in talks)
    rows, started = [], time.time()
    total = sum(len(m.settings) for m in models) * n_sent * (1 + len(segmenters))
    with tqdm(total=total, unit="sent", disable=args.quiet, dynamic_ncols=True) as bar:
        for m in models:
            model, tok, _ = load_checkpoint(m.path, device, dtype)
            decoder = StreamingDecoder(model, tok)
            for setting in m.settings:
                text = setting_text(setting)
                for name, set_talks in by_set.items():
                    sources = [s for t in set_talks for s in t.sources]
                    references = [r for t in set_talks for r in t.references]
                    per = score_results(simulate(decoder, sources, batch_size=args.batch_size, progress=bar,
                                                 **setting), references, args.sacrebleu_tokenizer)
                    for seg_name, seg in segmenters:
                        outputs = stream_talks(decoder, set_talks, seg, setting, seconds_per_word=spw,
                                               batch_size=args.batch_size)
                        bar.update(len(sources))
                        long = score_talks(outputs, spw, args.sacrebleu_tokenizer)
                        logs = write_simulstream_logs(
                            outputs, spw, out / "simulstream" / name / row_name(f"{m.name}.{text}.{seg_name}"))
                        realigned = long.pop("realigned")
                        logs["log"].with_name("realigned.txt").write_text(
                            "".join(h + "\n" for h in realigned), encoding="utf-8")
                        rows.append({
                            "set": name, "label": m.label, "model": m.name, "policy": m.policy, "setting": text,
                            "segmenter": seg_name, "talks": len(set_talks), "sentences": len(sources),
                            "sentence_level": {"BLEU": per["BLEU"], "AL": per["simuleval"]["AL"],
                                               "LAAL": per["simuleval"]["LAAL"], "no_output": per["no_output"]},
                            "long_form": long,
                            "BLEU_cost": per["BLEU"] - long["BLEU"],
                            "latency_cost": long["StreamLAAL"] - per["simuleval"]["LAAL"],
                            "simulstream_logs": str(logs["log"].parent),
                        })
            del decoder, model
    meta = {"wpm": args.wpm, "seconds_per_word": spw, "min_talk_words": args.min_talk_words,
            "talks": [{"name": t.name, "sentences": len(t.sources), "words": len(t.words)} for t in talks],
            "sacrebleu_tokenizer": args.sacrebleu_tokenizer, "device": str(device), "dtype": args.dtype,
            "seconds": round(time.time() - started, 2)}
    (out / "longform.json").write_text(json.dumps({**meta, "results": rows}, indent=2, ensure_ascii=False,
                                                  allow_nan=True) + "\n")
    if not args.quiet:
        print(format_long_form(rows))
        print(f"\nwrote {out / 'longform.json'} and simulstream logs under {out / 'simulstream'}")
    return rows


def format_long_form(rows: list[dict]) -> str:
    head = (f"{'set':<10} {'model':<12} {'setting':<9} {'segmenter':<13} {'talks':>5} {'sents':>5} | "
            f"{'BLEU sent':>9} {'BLEU long':>9} {'cost':>6} | {'AL':>6} {'LAAL':>6} {'StrLAAL':>7} "
            f"{'StrLAAL-CA':>10} {'cost':>6}")
    lines = ["per-sentence: BLEU, AL, LAAL (SimulEval words); long form: BLEU and StreamLAAL (source words) "
             "after mweralign", head, "-" * len(head)]
    for r in rows:
        s, lf = r["sentence_level"], r["long_form"]
        lines.append(f"{r['set']:<10} {r['model']:<12} {r['setting']:<9} {r['segmenter']:<13} {r['talks']:>5} "
                     f"{r['sentences']:>5} | {s['BLEU']:>9.2f} {lf['BLEU']:>9.2f} {r['BLEU_cost']:>6.2f} | "
                     f"{s['AL']:>6.2f} {s['LAAL']:>6.2f} {lf['StreamLAAL']:>7.2f} {lf['StreamLAAL_CA']:>10.2f} "
                     f"{r['latency_cost']:>6.2f}")
    return "\n".join(lines)
