"""The markdown tables of docs/evaluation.md's long-form section from `evaluate --long-form` results.

    python recipes/longform_table.py runs/longform/*/longform.json
"""
from __future__ import annotations

import json
import sys


def main(paths: list[str]) -> None:
    rows, talks, meta = [], {}, None
    for p in paths:
        data = json.load(open(p, encoding="utf-8"))
        meta = meta or data
        rows += data["results"]
        for t in data["talks"]:
            talks[t["name"]] = t
    sets = list(dict.fromkeys(r["set"] for r in rows))
    n_talks = {s: sum(1 for t in talks if t.startswith(s + "/")) for s in sets}
    n_words = {s: sum(t["words"] for n, t in talks.items() if n.startswith(s + "/")) for s in sets}
    print(f"{len(talks)} talks, {sum(n_words.values()):,} source words, {meta['wpm']:g} words a minute; "
          "BLEU and latency in SimulEval's convention (source words); long form re-aligned with mweralign.\n")
    for s in sets:
        sub = [r for r in rows if r["set"] == s]
        print(f"**{s}** ({n_talks[s]} talks, {sub[0]['sentences']} sentences, {n_words[s]:,} words)\n")
        print("| model | setting | segmenter | segments | BLEU per sentence | BLEU long form | BLEU cost "
              "| AL | LAAL | StreamLAAL | StreamLAAL (comp.-aware) | latency cost |")
        print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in sub:
            sl, lf = r["sentence_level"], r["long_form"]
            print(f"| {r['label']} | {r['setting'].replace('delta=', 'δ=')} | {r['segmenter']} | {lf['segments']} "
                  f"| {sl['BLEU']:.2f} | {lf['BLEU']:.2f} | {r['BLEU_cost']:+.2f} | {sl['AL']:.2f} | {sl['LAAL']:.2f} "
                  f"| {lf['StreamLAAL']:.2f} | {lf['StreamLAAL_CA']:.2f} | {r['latency_cost']:+.2f} |")
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
