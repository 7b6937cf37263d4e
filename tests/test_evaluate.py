"""`simulserve evaluate` and `simulserve plot-alignment` on tiny checkpoints: the numbers
equal models/metrics/latency.py + sacrebleu applied to simulate(), the files are valid, bad input
gives clear errors."""
from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from clients.cli import main
from models.metrics.latency import corpus_scores, paper_convention_scores, sentence_scores
from models.data.synthetic import make_pairs
from models.translate import simulate

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SET_A = make_pairs(12, min_len=1, max_len=9, seed=41)
SET_B = make_pairs(7, min_len=2, max_len=6, seed=42)
KS, DELTAS = (1, 3), (0.5, 1.0)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def write_set(directory: Path, name: str, pairs, src_lang="de", tgt_lang="en") -> tuple[Path, Path]:
    src, ref = directory / f"{name}.{src_lang}", directory / f"{name}.{tgt_lang}"
    src.write_text("\n".join(s for s, _ in pairs) + "\n")
    ref.write_text("\n".join(t for _, t in pairs) + "\n")
    return src, ref


def assert_png(path: Path) -> None:
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG_MAGIC
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert image.std() > 0  # not a blank canvas


@pytest.fixture(scope="module")
def evaluation(trained, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("evaluate")
    a, b = write_set(tmp, "setA", SET_A), write_set(tmp, "setB", SET_B)
    out = tmp / "out"
    argv = ["evaluate", "--checkpoint", str(trained["gma"]), "--checkpoint", str(trained["waitk"]),
            "--checkpoint", str(trained["offline"]), "--k", ",".join(map(str, KS)),
            "--delta", ",".join(map(str, DELTAS)), "--source", str(a[0]), "--reference", str(a[1]),
            "--source", str(b[0]), "--reference", str(b[1]), "--output", str(out), "--device", "cpu"]
    return argv, out


@pytest.fixture(scope="module")
def evaluation_run(evaluation):
    import contextlib
    import io

    argv, out = evaluation
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(argv)
    return code, stdout.getvalue(), out


def expected_row(decoder, pairs, setting) -> dict:
    """The metrics computed independently: simulate() + models/metrics/latency.py + sacrebleu."""
    import sacrebleu

    sources, refs = [s for s, _ in pairs], [t for _, t in pairs]
    results = simulate(decoder, sources, **setting)
    words = corpus_scores(sentence_scores(r.delays, r.source_words, len(r.delays), ref_len=len(ref.split()))
                          for r, ref in zip(results, refs) if r.delays)  # SimulEval skips empty outputs
    paper = corpus_scores(paper_convention_scores(r.token_delays[:-1], r.source_subwords) for r in results)
    return {"BLEU": sacrebleu.corpus_bleu([r.prediction for r in results], [refs]).score,
            "simuleval": words.as_dict(), "paper": paper.as_dict(),
            "no_output": sum(not r.delays for r in results)}


def test_evaluate_writes_table_json_csv_matching_the_latency_module(evaluation_run, trained_decoders):
    code, stdout, out = evaluation_run
    assert code == 0
    rows = json.loads((out / "results.json").read_text())["results"]
    want = [(s, p, st) for s in ("setA", "setB")
            for p, st in [("gma", f"delta={d:g}") for d in DELTAS] + [("waitk", f"k={k}") for k in KS]
            + [("offline", "offline")]]
    assert [(r["set"], r["policy"], r["setting"]) for r in rows] == want
    pairs = {"setA": SET_A, "setB": SET_B}
    for r in rows:
        setting = {"k": r["k"]} if r["policy"] == "waitk" else {"delta": r["delta"]} if r["policy"] == "gma" else {}
        exp = expected_row(trained_decoders[r["policy"]], pairs[r["set"]], setting)
        assert r["BLEU"] == pytest.approx(exp["BLEU"], rel=1e-12)
        assert r["simuleval"] == pytest.approx(exp["simuleval"], rel=1e-12)
        assert r["paper"] == pytest.approx(exp["paper"], rel=1e-12)
        assert r["sentences"] == len(pairs[r["set"]]) and r["no_output"] == exp["no_output"]
    # the CSV holds the same numbers, flat
    with open(out / "results.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows)
    for r, c in zip(rows, table):
        assert (c["set"], c["policy"], c["setting"]) == (r["set"], r["policy"], r["setting"])
        assert float(c["BLEU"]) == pytest.approx(r["BLEU"])
        for m in ("AL", "LAAL", "AP", "DAL", "CW"):
            assert float(c[m]) == pytest.approx(r["simuleval"][m])
            assert float(c[f"paper_{m}"]) == pytest.approx(r["paper"][m])
    # the printed table: both conventions, one line per row, AL as printed
    assert "SimulEval: words" in stdout and "GMA paper: subwords + EOS" in stdout
    lines = [line for line in stdout.splitlines() if line.startswith(("setA", "setB"))]
    assert len(lines) == len(rows)
    for line, r in zip(lines, rows):
        assert f"{r['BLEU']:.2f}" in line and f"{r['simuleval']['AL']:.3f}" in line
    # per-sentence outputs, with the references
    detail = out / "outputs" / "setA" / f"{rows[0]['model']}.delta=0.5.jsonl"
    first = json.loads(detail.read_text().splitlines()[0])
    assert first["source"] == SET_A[0][0] and first["reference"] == SET_A[0][1]


def test_markdown_tables_hold_the_results_rows(evaluation_run):
    """The README's tables (recipes/results_tables.py): one per set, one line per row, both conventions."""
    from agents.evaluate import markdown_tables
    code, _, out = evaluation_run
    assert code == 0
    d = json.loads((out / "results.json").read_text())
    text = markdown_tables(d["results"], d["sets"])
    for s in d["sets"]:
        assert f"**{s['name']}** ({s['sentences']} sentences)" in text
    lines = [line for line in text.splitlines() if line.startswith("| ") and "BLEU" not in line]
    assert len(lines) == len(d["results"])
    for line, r in zip(lines, d["results"]):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[2] == f"{r['BLEU']:.2f}" and cells[3] == f"{r['simuleval']['AL']:.2f}"
        assert cells[8] == f"{r['paper']['AL']:.2f}" and cells[-1] == f"{r['paper']['CW']:.2f}"


def test_evaluate_draws_a_valid_bleu_al_png_per_set(evaluation_run):
    code, _, out = evaluation_run
    assert code == 0
    for name in ("setA", "setB"):
        assert_png(out / f"bleu_al.{name}.png")


def test_evaluate_data_directory_shortcut(trained, tmp_path, capsys):
    data = tmp_path / "de-en"
    data.mkdir()
    write_set(data, "test", SET_B)
    write_set(data, "test.alpha", SET_B[:3])
    write_set(data, "test.beta", SET_B[3:])
    write_set(data, "valid", SET_A)
    code = main(["evaluate", "-m", str(trained["waitk"]), "--data", str(data), "--output", str(tmp_path / "o"),
                 "--quiet", "--device", "cpu"])
    assert code == 0
    res = json.loads((tmp_path / "o" / "results.json").read_text())
    assert [s["name"] for s in res["sets"]] == ["test", "test.alpha", "test.beta"]
    assert [s["sentences"] for s in res["sets"]] == [7, 3, 4]
    assert [r["setting"] for r in res["results"]] == ["k=2"] * 3  # the checkpoint's default k
    code = main(["evaluate", "-m", str(trained["waitk"]), "--data", str(data), "--sets", "beta",
                 "--splits", "test,valid", "--output", str(tmp_path / "o2"), "--quiet", "--device", "cpu"])
    assert code == 0
    res = json.loads((tmp_path / "o2" / "results.json").read_text())
    assert [s["name"] for s in res["sets"]] == ["test.beta"]
    capsys.readouterr()
    code = main(["evaluate", "-m", str(trained["waitk"]), "--data", str(data), "--sets", "gamma",
                 "--output", str(tmp_path / "o3"), "--quiet", "--device", "cpu"])
    err = capsys.readouterr().err                                # a typo: the error names what there is
    assert code == 2 and "and sets ['gamma']" in err and "its sets of test: alpha, beta" in err


def test_evaluate_refuses_a_too_long_line_before_it_starts(trained, tmp_path, capsys):
    """A line over the model's positions (48 in the tiny models) would stop the sweep halfway: the run is refused
    first, naming the file and line, with the same rule `translate` and a stream's push apply."""
    pairs = SET_B[:3] + [(" ".join(["haus"] * 60), "x")]
    src, ref = write_set(tmp_path, "setA", pairs)
    code = main(["evaluate", "-m", str(trained["waitk"]), "--source", str(src), "--reference", str(ref),
                 "-o", str(tmp_path / "o"), "--quiet", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"{src} line 4: sentence too long: 61 subwords with EOS, the model takes at most 48" in err
    assert not (tmp_path / "o" / "results.json").exists()


def test_evaluate_append_equals_one_run(trained, tmp_path):
    """Two --append runs (wait-k, then GMA and wait-k again) give the rows of one run over both."""
    a = write_set(tmp_path, "setA", SET_A[:5])
    common = ["--source", str(a[0]), "--reference", str(a[1]), "--quiet", "--device", "cpu"]
    gma, waitk = str(trained["gma"]), str(trained["waitk"])
    assert main(["evaluate", "-m", gma, "-m", waitk, "--k", "1,3", "-o", str(tmp_path / "one"), *common]) == 0
    assert main(["evaluate", "-m", waitk, "--k", "1", "-o", str(tmp_path / "two"), "--append", *common]) == 0
    assert main(["evaluate", "-m", gma, "-m", waitk, "--k", "1,3", "-o", str(tmp_path / "two"), "--append",
                 *common]) == 0
    one = json.loads((tmp_path / "one" / "results.json").read_text())["results"]
    two = json.loads((tmp_path / "two" / "results.json").read_text())["results"]
    key = lambda r: (r["set"], r["model"], r["setting"])  # noqa: E731
    assert sorted(map(key, two)) == sorted(map(key, one)) and len(two) == 3
    for r1, r2 in zip(sorted(one, key=key), sorted(two, key=key)):
        assert (r1["BLEU"], r1["simuleval"], r1["paper"]) == (r2["BLEU"], r2["simuleval"], r2["paper"])
    # other scoring options cannot be merged
    assert main(["evaluate", "-m", waitk, "-o", str(tmp_path / "two"), "--append", "--no-use-ref-len",
                 *common]) == 2
    # the same parts run side by side into their own directories, merged by recipes/merge_results.py
    assert main(["evaluate", "-m", gma, "-o", str(tmp_path / "partA"), *common]) == 0
    assert main(["evaluate", "-m", waitk, "--k", "1,3", "-o", str(tmp_path / "partB"), *common]) == 0
    r = subprocess.run([sys.executable, str(ROOT / "recipes" / "merge_results.py"), str(tmp_path / "merged"),
                        str(tmp_path / "partA"), str(tmp_path / "partB")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    merged = json.loads((tmp_path / "merged" / "results.json").read_text())["results"]
    assert sorted(map(key, merged)) == sorted(map(key, one))
    for r1, r2 in zip(sorted(one, key=key), sorted(merged, key=key)):
        assert (r1["BLEU"], r1["simuleval"], r1["paper"]) == (r2["BLEU"], r2["simuleval"], r2["paper"])
    outputs = sorted(p.name for p in (tmp_path / "merged" / "outputs").rglob("*.jsonl"))
    assert outputs == sorted(p.name for p in (tmp_path / "one" / "outputs").rglob("*.jsonl")) and len(outputs) == 3
    assert (tmp_path / "merged" / "results.csv").read_text().count("\n") == 4   # header + 3 rows


def test_evaluate_name_renames_rows_and_output_files_only(trained, tmp_path):
    """--name: a candidate anywhere evaluated under another name (the shipping gate runs a candidate
    under the shipped model's): the same figures and translations, the rows and output files named as asked."""
    a = write_set(tmp_path, "setA", SET_A[:5])
    common = ["--source", str(a[0]), "--reference", str(a[1]), "--quiet", "--device", "cpu", "--delta", "1"]
    gma = str(trained["gma"])
    assert main(["evaluate", "-m", gma, "-o", str(tmp_path / "plain"), *common]) == 0
    assert main(["evaluate", "-m", gma, "--name", "gma_delta1", "-o", str(tmp_path / "named"), *common]) == 0
    plain = json.loads((tmp_path / "plain" / "results.json").read_text())["results"]
    named = json.loads((tmp_path / "named" / "results.json").read_text())["results"]
    assert [r["model"] for r in named] == ["gma_delta1"] and plain[0]["model"] != "gma_delta1"
    for r1, r2 in zip(plain, named):
        assert (r1["BLEU"], r1["simuleval"], r1["checkpoint"]) == (r2["BLEU"], r2["simuleval"], r2["checkpoint"])
    (p1,), (p2,) = ((tmp_path / d / "outputs").rglob("*.jsonl") for d in ("plain", "named"))
    assert p2.name == "gma_delta1.delta=1.jsonl" and p1.read_text() != "" and \
        [json.loads(x)["prediction"] for x in p1.read_text().splitlines()] == \
        [json.loads(x)["prediction"] for x in p2.read_text().splitlines()]


# ------------------------------------------------------------- bad input

def bad_inputs(tmp: Path, trained) -> dict:
    good_src, good_ref = write_set(tmp, "good", SET_B)
    short_src, short_ref = write_set(tmp, "short", SET_B)
    short_ref.write_text("\n".join(t for _, t in SET_B[:-1]) + "\n")
    empty_src, empty_ref = write_set(tmp, "empty", SET_B)
    lines = [s for s, _ in SET_B]
    lines[3] = "   "
    empty_src.write_text("\n".join(lines) + "\n")
    no_config = tmp / "not_a_checkpoint"
    no_config.mkdir()
    ok = ["--source", str(good_src), "--reference", str(good_ref)]
    gma = ["-m", str(trained["gma"])]
    return {
        "mismatched line counts": (gma + ["--source", str(short_src), "--reference", str(short_ref)],
                                   "line counts differ: .*short.de has 7 lines, .*short.en has 6"),
        "empty line": (gma + ["--source", str(empty_src), "--reference", str(empty_ref)],
                       "empty.de: line 4 is empty"),
        "unknown checkpoint": (["-m", str(tmp / "no_such_model")] + ok, "no checkpoint directory"),
        "directory without config": (["-m", str(no_config)] + ok, "config.json is missing"),
        "missing source file": (gma + ["--source", str(tmp / "nope.de"), "--reference", str(good_ref)],
                                "source file not found"),
        "unpaired source": (gma + ["--source", str(good_src)], "1 --source but 0 --reference"),
        "no test set": (gma, "no test set"),
        "bad k list": (["-m", str(trained["waitk"]), "--k", "1,x"] + ok,
                       "--k '1,x': expected comma-separated integers"),
        "k below 1": (["-m", str(trained["waitk"]), "--k", "0,2"] + ok, "k must be an integer >= 1"),
        "negative delta": (gma + ["--delta", "-1"] + ok, "delta must be a finite number >= 0"),
        "labels per checkpoint": (gma + ["--label", "a", "--label", "b"] + ok, "--label given 2 times"),
        "unknown tokenizer": (gma + ["--sacrebleu-tokenizer", "nope"] + ok, "--sacrebleu-tokenizer 'nope'"),
        "names per checkpoint": (gma + ["--name", "a", "--name", "b"] + ok, "--name given 2 times"),
        "name with a slash": (gma + ["--name", "../x"] + ok, "cannot be empty, hold a slash"),
        "the same name twice": (gma + gma + ["--name", "x", "--name", "x"] + ok, "each checkpoint needs its own name"),
    }


CASES = ["mismatched line counts", "empty line", "unknown checkpoint", "directory without config",
         "missing source file", "unpaired source", "no test set", "bad k list", "k below 1",
         "negative delta", "labels per checkpoint", "unknown tokenizer", "names per checkpoint",
         "name with a slash", "the same name twice"]


@pytest.mark.parametrize("case", CASES)
def test_evaluate_bad_input_gives_a_clear_error(case, trained, tmp_path, capsys):
    import re

    argv, message = bad_inputs(tmp_path, trained)[case]
    code = main(["evaluate", *argv, "--output", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert "simulserve evaluate: error:" in err and re.search(message, err), err
    assert "Traceback" not in err
    assert not (tmp_path / "out" / "results.json").exists()


# ------------------------------------------------------------- plot-alignment

@pytest.mark.parametrize("policy, setting", [("gma", ["--delta", "1"]), ("waitk", ["--k", "2"]),
                                             ("offline", [])])
def test_plot_alignment(policy, setting, trained, trained_decoders, tmp_path):
    sentence = "haus baum wald stein licht wasser"
    png, data_file = tmp_path / "a.png", tmp_path / "a.json"
    code = main(["plot-alignment", "-m", str(trained[policy]), "--sentence", sentence, *setting,
                 "--layer", "all", "--output", str(png), "--json", str(data_file)])
    assert code == 0
    assert_png(png)
    data = json.loads(data_file.read_text())
    kw = {"delta": 1.0} if policy == "gma" else {"k": 2} if policy == "waitk" else {}
    sim = simulate(trained_decoders[policy], [sentence], **kw)[0]
    assert data["translation"] == sim.prediction
    assert data["token_delays"] == sim.token_delays[: len(data["target_pieces"])]
    assert len(data["source_pieces"]) == sim.source_subwords + 1  # + EOS
    for layer, matrix in enumerate(data["attention"]):
        assert len(matrix) == len(data["target_pieces"])
        for i, row in enumerate(matrix):
            visible = [v for v in row if v is not None]
            # the decoder attends only to what it had read when it wrote token i (the path)
            assert len(visible) == data["token_delays"][i]
            assert all(v is None for v in row[len(visible):])
            assert math.fsum(visible) == pytest.approx(1.0, abs=1e-4)
            if policy == "gma":  # p_i and its window lie inside what was read
                assert data["n"][layer][i] <= data["token_delays"][i]
                assert 0.9 - 1e-6 <= data["p"][layer][i] < data["token_delays"][i]
            else:
                assert data["p"][layer][i] is None


def test_plot_alignment_bad_layer(trained, tmp_path, capsys):
    code = main(["plot-alignment", "-m", str(trained["gma"]), "--sentence", "haus baum", "--layer", "7",
                 "--output", str(tmp_path / "x.png")])
    assert code == 2
    assert "--layer 7: the model has 2 decoder layers" in capsys.readouterr().err


def test_gma_init_table_interpolates_the_waitk_curve_at_matched_al():
    """recipes/gma_init/table.py: the wait-k curve's BLEU at a GMA point's AL, linear between neighbours."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gma_init_table", ROOT / "recipes" / "gma_init" / "table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)

    def result(policy, setting, al, bleu, label):
        return {"set": "test.everyday", "policy": policy, "setting": setting, "label": label, "BLEU": bleu,
                "simuleval": {"AL": al}}
    results = [result("waitk", "k=1", 2.0, 10.0, "D"), result("waitk", "k=3", 4.0, 20.0, "D"),
               result("gma", "delta=1", 3.0, 16.0, "A"), result("gma", "delta=2", 5.0, 30.0, "A")]
    rows = table.rows(results)
    assert [(r["setting"], r["waitk_BLEU"], r["delta"]) for r in rows] == [("delta=1", 15.0, 1.0),
                                                                           ("delta=2", None, None)]


def test_gma_init_table_reads_results_csv_as_json(evaluation_run, tmp_path):
    """table.py on evaluate's results.csv (the committed form of earlier arms) = on its results.json."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gma_init_table", ROOT / "recipes" / "gma_init" / "table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    _, _, out = evaluation_run

    def rows(name):  # the fixture's sets are not named test.*, as the table expects
        loaded = table.load([str(out / name)])
        return table.rows([dict(r, set="test." + r["set"]) for r in loaded])
    from_json, from_csv = rows("results.json"), rows("results.csv")
    assert from_json and [r["setting"] for r in from_json] == [r["setting"] for r in from_csv]
    for j, c in zip(from_json, from_csv):
        assert c["BLEU"] == pytest.approx(j["BLEU"], rel=1e-9) and c["AL"] == pytest.approx(j["AL"], rel=1e-9)
        assert (c["delta"] is None) == (j["delta"] is None)
        if j["delta"] is not None:
            assert c["delta"] == pytest.approx(j["delta"], rel=1e-9, abs=1e-9)
    # --plots: one BLEU-AL plot per set, from the CSV's rows
    written = table.plots(table.load([str(out / "results.csv")]), tmp_path / "plots")
    assert sorted(p.name for p in written) == ["bleu_al.setA.png", "bleu_al.setB.png"]
    assert all(p.stat().st_size > 1000 for p in written)


def test_per_source_table_cuts_the_pooled_set_at_its_sources(tmp_path):
    """recipes/per_source_table.py: the pooled dialogue outputs are cut where each game's test set ends,
    checked line by line; outputs that do not follow the per-source files are refused."""
    import importlib.util
    from models.translate import SentenceResult
    spec = importlib.util.spec_from_file_location("per_source", ROOT / "recipes" / "per_source_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    german = {"freedroid": ["Hallo du", "Wer bist du"], "hedgewars": ["Feuer"], "wesnoth": ["Vorwärts", "Halt"]}
    for source, lines in german.items():
        (tmp_path / f"test.{source}.de").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    results = [SentenceResult(x, "x", [1], [1], [1, 1], 1, 1, 2, 0.0) for lines in german.values() for x in lines]
    parts = table.split_by_source(results, [f"ref {i}" for i in range(5)], tmp_path, "dialogue")
    assert {s: [r.source for r in p[0]] for s, p in parts.items()} == german
    assert parts["wesnoth"][1] == ["ref 3", "ref 4"]
    with pytest.raises(SystemExit, match="hedgewars"):
        table.split_by_source(results[:2] + results[3:] + results[2:3], ["r"] * 5, tmp_path, "dialogue")
    with pytest.raises(SystemExit, match="no source"):
        table.split_by_source(results + results[:1], ["r"] * 6, tmp_path, "dialogue")


def test_short_hypotheses_counts_negative_al_and_early_stops():
    """recipes/short_hypotheses.py: paper-convention AL < 0 for a hypothesis that stops early."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("short_hyp", ROOT / "recipes" / "short_hypotheses.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    from types import SimpleNamespace as Result   # the two fields summarise reads of a SentenceResult
    # 19 source pieces (+ EOS = 20): five pieces written within the first three, then EOS at the end
    early = Result(token_delays=[1, 1, 2, 2, 3, 20], source_subwords=19)
    # word by word to the end: positive AL, nothing stopped early
    steady = Result(token_delays=list(range(1, 20)) + [20, 20], source_subwords=19)
    s = mod.summarise([early, steady])
    assert (s["sentences"], s["negative_al"], s["stopped_early"], s["both"]) == (2, 1, 1, 1)
    assert s["gamma_negative"] == [6 / 20]
