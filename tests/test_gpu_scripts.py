"""The GPU scripts (recipes/gpu/): CI has no GPU, so train.sh runs its CPU dry run here, and every
command check.sh runs is checked against the CLI's own options."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml
from test_training import model_dict, write_dataset

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "recipes" / "gpu"


def run_train(recipe, minutes, env):
    return subprocess.run(["bash", str(GPU / "train.sh"), str(recipe), str(minutes)], cwd=ROOT,
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=300)


def test_train_script_resumes_and_brings_back_a_small_checkpoint(word_tok, tmp_path):
    write_dataset(word_tok, tmp_path / "data")
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(yaml.safe_dump({"output": "ignored", "max_tokens": 256, "warmup": 10, "max_epochs": 1000,
                                      "average_last": 1, "save_every_minutes": 0.01,
                                      "model": model_dict(word_tok, "gma")}))
    env = {"DEVICE": "cpu", "PY": sys.executable, "DATA": str(tmp_path / "data"), "STATE": str(tmp_path / "state"),
           "OUT": str(tmp_path / "out"), "RESUME": str(tmp_path / "resume")}
    first = run_train(recipe, 0.03, env)
    assert first.returncode == 0, first.stderr[-2000:]
    got = tmp_path / "out" / "tiny"
    assert {"config.json", "model.safetensors", "spm.model", "progress.txt"} <= {p.name for p in got.iterdir()}
    step1 = int(re.search(r"step (\d+)", (got / "progress.txt").read_text()).group(1))
    assert step1 > 0
    second = run_train(recipe, 0.03, env)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "resuming" in second.stdout
    step2 = int(re.search(r"step (\d+)", (got / "progress.txt").read_text()).group(1))
    assert step2 > step1
    # the machine went back: no state, the weights that came back are carried instead
    (tmp_path / "state").rename(tmp_path / "gone")
    got.rename(tmp_path / "resume")
    third = run_train(recipe, 0.02, env)
    assert third.returncode == 0, third.stderr[-2000:]
    assert "starting from the carried weights" in third.stdout
    assert (got / "model.safetensors").stat().st_size < 16 * 2**20


def check_commands() -> list[list[str]]:
    """The `simulserve ...` commands check.sh runs (its `step` lines and its profile script), as argument lists."""
    text = "".join((GPU / name).read_text() for name in ("check.sh", "profile_engine.sh", "two_servers.sh"))
    joined = re.sub(r"\\\n\s*", " ", text)
    cmds = []
    for line in joined.splitlines():
        m = re.search(r"\bsimulserve (bench \w+|evaluate)\b(.*?)(?:\|\||$)", line)
        if m and not line.lstrip().startswith("#"):
            cmds.append(m.group(1).split() + shlex.split(m.group(2).replace("\\\"", "").replace("$", "")))
    return cmds


def test_every_command_of_the_gpu_check_takes_its_options():
    cmds = check_commands()
    assert {tuple(c[:2]) for c in cmds} >= {("bench", "step"), ("bench", "engine"), ("bench", "server")}
    assert any(c[0] == "evaluate" for c in cmds)
    for cmd in cmds:
        sub = cmd[:2] if cmd[0] == "bench" else cmd[:1]
        helptext = subprocess.run([sys.executable, "-m", "clients.cli", *sub, "-h"], cwd=ROOT, capture_output=True,
                                  text=True, timeout=120).stdout
        for flag in (a for a in cmd if a.startswith("--")):
            assert re.search(rf"{re.escape(flag)}\b", helptext), (sub, flag)
    syntax = subprocess.run(["bash", "-n", str(GPU / "check.sh")], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr


def test_every_recipe_the_gpu_check_runs_takes_its_options():
    """The `"$PY" recipes/NAME.py ...` commands of check.sh: each flag is one the recipe's -h lists."""
    joined = re.sub(r"\\\n\s*", " ", "".join((GPU / name).read_text() for name in ("check.sh", "two_engines.sh")))
    cmds = [(m.group(1), shlex.split(m.group(2).replace("\\\"", "").replace("$", "")))
            for line in joined.splitlines() if not line.lstrip().startswith("#")
            for m in [re.search(r'"\$PY" (recipes/[\w/]+\.py)\b(.*?)(?:\|\||$)', line)] if m]
    assert {c for c, _ in cmds} >= {"recipes/engine_flat_out.py", "recipes/graph_breaks.py"}
    assert any("--switch-interval-ms" in args for _, args in cmds) and any("--no-yield" in args for _, args in cmds)
    for recipe, args in cmds:
        helptext = subprocess.run([sys.executable, recipe, "-h"], cwd=ROOT, capture_output=True, text=True,
                                  timeout=120).stdout
        for flag in (a for a in args if a.startswith("--")):
            assert re.search(rf"{re.escape(flag)}\b", helptext), (recipe, flag)


def test_two_engines_run_at_once_and_their_words_are_added(tmp_path):
    """two_engines.sh's CPU dry run with the tiny model: both engines report, and the sum is theirs."""
    tiny = tmp_path / "tiny"
    made = subprocess.run([sys.executable, "recipes/engine_flat_out.py", "--tiny", "--save-tiny", str(tiny)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "test.de").write_text("das ist ein haus\nwir gehen nach hause heute\nja\n")
    env = {**os.environ, "DEVICE": "cpu", "STEP": "default", "CKPT": str(tiny), "DATA": str(tmp_path / "data"),
           "PY": sys.executable, "STREAMS": "8", "SECONDS_TIMED": "1", "WARM": "0.5", "OMP_NUM_THREADS": "1"}
    r = subprocess.run(["bash", str(GPU / "two_engines.sh"), str(tmp_path / "out")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    each = [json.loads((tmp_path / "out" / f"two_engines_{i}.json").read_text())["words_per_s"] for i in (1, 2)]
    assert all(w > 0 for w in each) and "4 streams flat out" in r.stdout
    total = float(re.search(r"together: (\d+) target words/s", r.stdout).group(1))
    assert abs(total - sum(each)) <= 1


def pack_wheels() -> list[str]:
    """The WHEELS=(...) list of pack.sh, comments left out."""
    text = (GPU / "pack.sh").read_text().split("WHEELS=(", 1)[1]
    names = []
    for line in text.splitlines():
        code = line.split("#")[0]
        names += code.split(")")[0].split()
        if ")" in code:
            return names
    raise AssertionError("pack.sh: WHEELS=( is not closed")


IMAGE_ONLY = """
import importlib, importlib.abc, importlib.metadata as md, sys
allowed = {line.strip().lower().replace("_", "-") for line in open(sys.argv[1]) if line.strip() and line[0] != "#"}
owners = md.packages_distributions()
class ImageOnly(importlib.abc.MetaPathFinder):
    # refuses a top-level module whose distributions are all missing from the image and the wheels
    def find_spec(self, name, path=None, target=None):
        dists = owners.get(name.split(".")[0])
        if "." in name or not dists or any(d.lower().replace("_", "-") in allowed for d in dists):
            return None
        raise ModuleNotFoundError(f"No module named {name!r} (not on the GPU image, not in pack.sh)", name=name)
sys.meta_path.insert(0, ImageOnly())
for module in sys.argv[2:]:
    importlib.import_module(module)
"""


def test_what_the_gpu_check_imports_is_on_the_gpu_image_or_among_the_carried_wheels(tmp_path):
    """The GPU machine has no package index: what the server, the CLI and training import must be on its
    image (recipes/gpu/image_packages.txt) or among the wheels pack.sh carries. Two GPU checks lost their
    server part to a missing wheel (opentelemetry-api, then httptools, which uvicorn's HTTP protocol,
    subclassed by server/guard.py, imports); this imports those modules with everything else refused."""
    names = pack_wheels()
    image = [line for line in (GPU / "image_packages.txt").read_text().splitlines() if line and line[0] != "#"]
    allowed = tmp_path / "allowed.txt"
    allowed.write_text("\n".join(image + names + ["simulserve"]) + "\n")
    modules = ["server.app", "server.bench", "clients.cli", "models.training.train", "models.benchmarks.engine"]
    done = subprocess.run([sys.executable, "-c", IMAGE_ONLY, str(allowed), *modules], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    # the finder does refuse: without the wheels the server does not import
    allowed.write_text("\n".join(image + ["simulserve"]) + "\n")
    refused = subprocess.run([sys.executable, "-c", IMAGE_ONLY, str(allowed), "server.app"], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "not on the GPU image" in refused.stderr


def test_run_boxed_script_checks_then_trains_runs_side_by_side_and_brings_back_at_most_8_files(word_tok, tmp_path):
    """run_boxed.sh's CPU dry run: the check (budgets of a second: its parts are cut off, as on a GPU when one
    runs long), then two runs trained side by side from one unpacked data set, packed so that no more than
    the 8 files the device tool returns come back."""
    write_dataset(word_tok, tmp_path / "data")
    subprocess.run(["tar", "-cJf", str(tmp_path / "train.tar.xz"), "-C", str(tmp_path / "data"), "."], check=True)
    recipes = []
    for name, lr in (("tiny_a", 1e-3), ("tiny_b", 5e-4)):
        recipe = tmp_path / f"{name}.yaml"
        recipe.write_text(yaml.safe_dump({"output": "ignored", "max_tokens": 256, "warmup": 10, "max_epochs": 1000,
                                          "average_last": 1, "lr": lr, "model": model_dict(word_tok, "gma")}))
        recipes.append(str(recipe))
    out = tmp_path / "out"
    budgets = ("TESTS", "STEP_BF16", "ENGINE", "ENGINE_FLAT", "GRAPHS", "SERVER", "SERVER_DECODER", "PROFILE", "TWO",
               "EVAL")
    env = {**os.environ, "DEVICE": "cpu", "PY": sys.executable, "OUT": str(out),
           "TRAIN_TAR": str(tmp_path / "train.tar.xz"), "TRAIN_DATA": str(tmp_path / "unpacked"),
           "STATE_ROOT": str(tmp_path / "state"), "TRAIN_MINUTES": "0.03",
           **{f"BUDGET_{part}": "1" for part in budgets}, "BUDGET_STEP": "0", "COMMIT": "abc1234"}
    done = subprocess.run(["bash", str(GPU / "run_boxed.sh"), "60", *recipes], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = (out / "gpu_check.md").read_text()
    assert "## CUDA tests" in report and ", commit abc1234\n" in report   # the commit as sent, not as git says there
    # a part given no budget is named as skipped; the others ran (and were cut off at their second)
    assert re.search(r"## bench step, float32[^\n]*\n\nskipped: budget 0", report)
    assert "stopped at its budget of 1 s" in report.split("## bench step, bfloat16", 1)[1]
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8, files
    for name in ("tiny_a", "tiny_b"):
        assert {p.name for p in (out / name).iterdir()} == {"model.safetensors", "run.tar"}
        listed = subprocess.run(["tar", "-tf", str(out / name / "run.tar")], capture_output=True, text=True).stdout
        assert {"config.json", "progress.txt", "train.log"} <= set(listed.split())
        assert int(re.search(r"step (\d+)", subprocess.run(
            ["tar", "-xOf", str(out / name / "run.tar"), "progress.txt"], capture_output=True, text=True).stdout
        ).group(1)) > 0


def test_train_curves_plot_the_runs_and_summarise_their_epoch_ends(tmp_path):
    import json
    run = tmp_path / "run"
    run.mkdir()
    (run / "updates.jsonl").write_text("".join(json.dumps({"step": s, "loss": 3.5 - s / 1000}) + "\n"
                                               for s in range(20, 401, 20)))
    (run / "log.jsonl").write_text("".join(json.dumps({"epoch": e, "step": 200 * e, "valid_loss": 2.5 - 0.1 * e})
                                           + "\n" for e in (1, 2)))
    out = tmp_path / "curves.png"
    done = subprocess.run([sys.executable, str(GPU / "train_curves.py"), str(out), f"{run}:tiny"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:4] == b"\x89PNG"
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["tiny"]["epoch_ends"] == [{"step": 200, "valid_loss": 2.4}, {"step": 400, "valid_loss": 2.3}]
    assert summary["tiny"]["last_train_loss"] == 3.1
    # a directory that is no training output is refused with a message
    bad = subprocess.run([sys.executable, str(GPU / "train_curves.py"), str(out), str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "updates.jsonl" in bad.stderr


def test_profile_summary_counts_each_thread_inclusive_and_self(tmp_path):
    """recipes/profile_summary.py (the tables of profile_engine.sh) on a raw py-spy profile written by hand."""
    raw = tmp_path / "profile.txt"
    raw.write_text("thread (0x1a): engine-m;_core (server/engine.py:300);step (models/step.py:10);"
                   "gather (models/cache_pool.py:5) 6\n"
                   "thread (0x1a): engine-m;_core (server/engine.py:300);step (models/step.py:12) 2\n"
                   "thread (0x1a): engine-m;_core (server/engine.py:301) 2\n"
                   "thread (7): MainThread;run (asyncio/runners.py:1);send (app.py:9) 1\n")
    done = subprocess.run([sys.executable, "recipes/profile_summary.py", str(raw), "--top", "5"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("11 samples; per thread: engine-m 10 (91%), MainThread 1 (9%)")
    engine = out.split("engine-m: functions running itself")[1].split("MainThread")[0]
    assert "| 60.0% | gather (cache_pool.py) |" in engine and "| 20.0% | step (step.py) |" in engine
    assert "| 80.0% | step (step.py) |" in out.split("engine-m: functions on the stack")[1]   # two lines, one function
    trunk = out.split("engine-m: functions on the stack")[1].split("engine-m:")[0]
    assert "_core (engine.py)" not in trunk   # the trunk every sample shares is left out


def test_the_quick_check_plans_its_parts_within_five_minutes(tmp_path):
    """PLAN=1 lists every part with its budget and runs nothing; QUICK=1 keeps what the targets need (the replay
    tests, bench step of the default form, the server's defaults) within 240 s of budgets, a minute of the five
    left for the machine's start; FLAT_OUT=1 adds the engine alone and the server with --overlap off beside the
    defaults (the A/B of overlapped jobs) and the server with --engines 1 (the A/B against the defaults' two engine
    processes on a GPU), within 480 s; a budget given explicitly
    still wins."""
    def plan(**env):
        r = subprocess.run(["bash", str(GPU / "check.sh")], cwd=ROOT, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PLAN": "1", "OUT": str(tmp_path / "out"), **env})
        assert r.returncode == 0, r.stdout + r.stderr
        parts = {m.group(2): int(m.group(1)) for m in re.finditer(r"^ *(\d+) s   (.+)$", r.stdout, re.M)}
        total = int(re.search(r"^total: (\d+) s", r.stdout, re.M).group(1))
        assert total == sum(parts.values())
        return parts, total
    full, full_total = plan()
    quick, quick_total = plan(QUICK="1")
    assert quick_total <= 240 < full_total <= 540   # the full set within one 10-minute command, with its installs
    for needed in ("CUDA tests", "bench step, float32, large batches", "bench server, the server's defaults"):
        assert any(name.startswith(needed) for name in quick), (needed, quick)
    assert any("forms graphs-encoder" in name for name in quick)   # QUICK times the default form alone
    assert any("forms sync-free,graphs,graphs-encoder" in name for name in full)
    for left_out in ("profile", "the engine alone flat out", "--overlap off"):
        assert not any(left_out in name for name in quick) and any(left_out in name for name in full)
    ab, ab_total = plan(QUICK="1", FLAT_OUT="1")
    assert quick_total < ab_total <= 480
    for needed in ("the engine alone flat out at 1024 streams, graphs-encoder (", "engine alone flat out at 1024 "
                   "streams, graphs-encoder, --overlap off", "bench server, the server's defaults but --overlap off",
                   "bench server, the server's defaults with --engines 1"):
        assert any(name.startswith(needed) or needed in name for name in ab), (needed, ab)
    mine, _ = plan(QUICK="1", BUDGET_PROFILE="70")
    assert any("profile" in name and budget == 70 for name, budget in mine.items())
    assert not (tmp_path / "out").exists()   # nothing ran, nothing was written


def test_the_no_mps_part_runs_the_defaults_with_mps_off(tmp_path):
    """BUDGET_SERVER_NO_MPS: the A/B of serve's own MPS daemon, the server's defaults with --mps off, its levels
    NO_MPS_LEVELS; reported in the one file, nothing of it without a budget."""
    budgets = {f"BUDGET_{p}": "0" for p in ("TESTS", "STEP", "SERVER", "ENGINE_FLAT", "ENGINE_NO_OVERLAP", "PROFILE")}
    env = {**os.environ, "DEVICE": "cpu", "PY": sys.executable, **budgets, "NO_MPS_LEVELS": "300,600"}
    for budget in ("1", "0"):
        out = tmp_path / f"out{budget}"
        r = subprocess.run(["bash", str(GPU / "check.sh")], cwd=ROOT, capture_output=True, text=True, timeout=120,
                           env={**env, "OUT": str(out), "BUDGET_SERVER_NO_MPS": budget})
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        part = (out / "gpu_check.md").read_text().split("but --mps off", 1)[1].split("\n## ", 1)[0]
        if budget == "1":
            command = part.split("$ ", 1)[1].splitlines()[0]
            assert "bench server" in command and "--mps off" in command and "--levels 300\\,600" in command
            assert "stopped at its budget of 1 s" in part
        else:
            assert "skipped: budget 0" in part and "$ " not in part


def test_the_engines_part_under_mps_starts_the_daemon_for_itself_and_stops_it(tmp_path):
    """BUDGET_SERVER_ENGINES_MPS: the --engines server again under NVIDIA's MPS. MPS cannot run here, so a
    stand-in `nvidia-cuda-mps-control` on PATH records how the check calls it: started (-d) before that part only,
    with its pipe and log folders in the environment the server inherits, and told to quit after it; where the
    command is missing the report says so and the part runs without it."""
    fake = tmp_path / "bin" / "nvidia-cuda-mps-control"
    fake.parent.mkdir()
    calls = tmp_path / "calls.txt"
    fake.write_text(f'#!/bin/sh\n[ "$1" = -d ] && what=start || what="$(cat)"\n'
                    f'echo "$what $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY" >> {calls}\n')
    fake.chmod(0o755)
    smi = tmp_path / "bin" / "nvidia-smi"   # and a stand-in sampler: SM utilisation only for the parts that run
    smi.write_text(f'#!/bin/sh\n[ "$1" = dmon ] || exit 0\necho dmon >> {calls}.dmon\n'
                   'while true; do echo "    0     37      5"; sleep 0.2; done\n')
    smi.chmod(0o755)
    budgets = {f"BUDGET_{p}": "0" for p in ("TESTS", "STEP", "SERVER", "ENGINE_FLAT", "ENGINE_NO_OVERLAP", "PROFILE")}

    def check(path, **env):
        out = tmp_path / f"out{len(list(tmp_path.glob('out*')))}"
        r = subprocess.run(["bash", str(GPU / "check.sh")], cwd=ROOT, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "DEVICE": "cpu", "PY": sys.executable, "OUT": str(out),
                                "PATH": path, **budgets, **env})
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        written.append(out)
        return (out / "gpu_check.md").read_text()
    written = []

    report = check(f"{fake.parent}:{os.environ['PATH']}", BUDGET_SERVER_ENGINES_MPS="1")
    started, stopped = calls.read_text().splitlines()
    assert started.startswith("start /") and stopped.startswith("quit /")
    assert started.split()[1:] == stopped.split()[1:]                  # the same daemon's pipes
    assert started.split()[1].endswith("/pipe") and started.split()[2].endswith("/log")
    part = report.split("under MPS, no admission", 1)[1]
    assert "MPS: control daemon started" in report.split("under MPS", 1)[0] and "MPS: control daemon stopped" in part
    assert "stopped at its budget of 1 s" in part                     # (the server itself: cut off at its second)
    assert (tmp_path / "calls.txt.dmon").read_text().split() == ["dmon"]   # one sampler, for the one part run
    assert "SM utilisation during this server run (nvidia-smi dmon, % per second): mean 37.0" in part
    assert "cannot open" not in report and report.count("SM utilisation") == 1
    # the report in $OUT: what else the check wrote is one archive beside it (a device returns at most 8 files)
    assert {p.name for p in written[0].iterdir()} == {"gpu_check.md", "gpu_check_files.tar.xz"}
    listed = subprocess.run(["tar", "-tJf", str(written[0] / "gpu_check_files.tar.xz")], capture_output=True,
                            text=True, check=True).stdout.split()
    assert "dmon_engines_mps.txt" in listed
    (written[0] / "earlier.md").write_text("another check's report")   # a second check into the same $OUT
    env = {**os.environ, "DEVICE": "cpu", "PY": sys.executable, "OUT": str(written[0]), **budgets,
           "BUDGET_SERVER_ENGINES_MPS": "1", "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    again = subprocess.run(["bash", str(GPU / "check.sh"), str(written[0] / "second.md")], cwd=ROOT,
                           capture_output=True, text=True, timeout=120, env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert {p.name for p in written[0].iterdir()} == {"gpu_check.md", "gpu_check_files.tar.xz", "earlier.md",
                                                     "second.md", "second_files.tar.xz"}
    calls.unlink()
    assert "MPS:" not in check(f"{fake.parent}:{os.environ['PATH']}")   # budget 0: no daemon, nothing said
    assert not calls.exists()
    missing = check(os.environ["PATH"], BUDGET_SERVER_ENGINES_MPS="1")
    assert "MPS: nvidia-cuda-mps-control is not on this machine" in missing


def test_step_trace_splits_each_steps_idle_device_time_by_what_it_waits_between():
    """recipes/gpu/step_trace.py's analysis of a Chrome trace: per step, the gaps between two kernels of one graph
    launch are the graph's own, every other gap is between launches; before the first activity and after the
    last are apart; the device's own step annotations are not steps; activities outside every step count
    nowhere."""
    sys.path.insert(0, str(GPU))
    from step_trace import STEP_MARK, analyse, kernel_kind, per_graph

    def x(name, cat, ts, dur, corr=None):
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur,
                "args": {} if corr is None else {"correlation": corr}}
    trace = {"traceEvents": [
        x(STEP_MARK, "user_annotation", 0, 100), x(STEP_MARK, "gpu_user_annotation", 10, 80),
        x("cudaMemcpyAsync", "cuda_runtime", 2, 3, 1), x("cudaGraphLaunch", "cuda_runtime", 6, 4, 2),
        x("Memcpy HtoD", "gpu_memcpy", 10, 2, 1),
        x("k1", "kernel", 20, 10, 2), x("k2", "kernel", 33, 10, 2), x("k3", "kernel", 45, 15, 2),
        x(STEP_MARK, "user_annotation", 200, 50),   # a step with no device work: all before
        x("stray", "kernel", 150, 5, 9),
    ]}
    r = analyse(trace)
    assert r["steps"] == 2 and r["activities/step"] == 2.0 and r["graph launches/step"] == 0.5
    ms = {k: round(v * 1000 * 2) for k, v in r.items() if k.endswith("ms/step")}   # (µs summed over the 2 steps)
    assert ms == {"busy ms/step": 2 + 35, "inside graphs ms/step": 3 + 2, "between launches ms/step": 8,
                  "before ms/step": 10 + 50, "after ms/step": 40}
    assert sum(ms.values()) == 100 + 50   # every microsecond of every step in one part
    # per graph: the one launch of three kernels, its span, kernels' time, gaps and widest gap; kinds by name
    (graph,) = per_graph(trace)
    assert {k: graph[k] for k in ("kernels", "launches", "span_us", "busy_us", "gaps_us", "widest_gap_us")} == \
        {"kernels": 3, "launches": 1, "span_us": 40, "busy_us": 35, "gaps_us": 5, "widest_gap_us": 3}
    assert graph["kinds"] == [("k1", 1, 10), ("k2", 1, 10), ("k3", 1, 15)]
    assert kernel_kind("void at::native::(anonymous namespace)::indexSelectSmallIndex<float, long>(at::x)") == \
        "indexSelectSmallIndex"
    assert kernel_kind("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, float>(x)") == \
        "gemvx::kernel"


def test_step_trace_records_a_trace_per_batch_size_and_reads_it_back(trained, tmp_path):
    """On the CPU (no device activities: every step's time is before) the recipe runs end to end: one xz trace
    per batch size with one marked step per step, and --analyse prints the same table from the files."""
    cmd = [sys.executable, str(GPU / "step_trace.py"), "-m", str(trained["waitk"]), "--device", "cpu",
           "--form", "graphs", "--batch-sizes", "1,2", "--sentences", "2", "--out", str(tmp_path)]
    source = tmp_path / "src.de"
    source.write_text("haus baum haus\nbaum haus\n")
    made = subprocess.run(cmd + ["--source", str(source)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.glob("trace_*")) == ["trace_b1.json.xz", "trace_b2.json.xz"]
    rows = [line for line in made.stdout.splitlines() if line.startswith("| batch ")]
    assert len(rows) == 2 and all(float(r.split("|")[2]) > 0 for r in rows)   # steps were marked
    again = subprocess.run([sys.executable, str(GPU / "step_trace.py"), "--analyse",
                            *(str(tmp_path / f"trace_b{b}.json.xz") for b in (1, 2))],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    reread = [line for line in again.stdout.splitlines() if line.startswith("| trace_b")]
    assert [r.split("|", 2)[2] for r in reread] == [r.split("|", 2)[2] for r in rows]
