"""SimulEval agents: the real `simuleval` command line on tiny checkpoints, and the agent
contract (one bundled WriteAction per step, finished=True at the end, per-sentence state)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

pytest.importorskip("simuleval")

from simuleval.agents.actions import ReadAction, WriteAction  # noqa: E402
from simuleval.data.dataloader import TextToTextDataloader  # noqa: E402
from simuleval.evaluator.instance import INSTANCE_TYPE_DICT  # noqa: E402

from agents.simul_agent import AgentError, GMAAgent, SimulAgent, SimulStates, WaitKAgent  # noqa: E402
from models.checkpoint import CheckpointError  # noqa: E402
from models.metrics.latency import corpus_scores, sentence_scores  # noqa: E402
from models.policies import PolicyError  # noqa: E402
from models.data.synthetic import make_pairs  # noqa: E402
from models.translate import simulate  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAIRS = make_pairs(10, min_len=1, max_len=9, seed=31)
SOURCES = [s for s, _ in PAIRS]
REFERENCES = [t for _, t in PAIRS]
SETTINGS = {"offline": {}, "waitk": {"k": 2}, "gma": {"delta": 1.0}}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def simuleval_command() -> list[str]:
    exe = Path(sys.executable).with_name("simuleval")
    if exe.is_file():
        return [str(exe)]
    return [sys.executable, "-c", "import sys; from simuleval.cli import main; sys.exit(main())"]


def agent_options(setting: dict) -> list[str]:
    return [x for key, v in setting.items() for x in (f"--{key}", str(v))]


# SimulEval runs: name -> (policy, setting, how the agent is given)
RUNS = {
    "offline": ("offline", SETTINGS["offline"], ["--agent", "agents/simuleval_agent.py"]),
    "waitk": ("waitk", SETTINGS["waitk"], ["--agent", "agents/simuleval_agent.py"]),
    "gma": ("gma", SETTINGS["gma"], ["--agent", "agents/simuleval_agent.py"]),
    "gma-agent-class": ("gma", {"delta": 0.5}, ["--agent-class", "agents.simul_agent.GMAAgent"]),
}


@pytest.fixture(scope="module")
def simuleval_runs(trained, tmp_path_factory):
    """The four `simuleval` command lines, started together (each is mostly start-up time)."""
    tmp = tmp_path_factory.mktemp("simuleval")
    (tmp / "src.txt").write_text("\n".join(SOURCES) + "\n")
    (tmp / "ref.txt").write_text("\n".join(REFERENCES) + "\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = {}
    for name, (policy, setting, how) in RUNS.items():
        cmd = simuleval_command() + how + [
            "--user-dir", "agents", "--checkpoint", str(trained[policy]), *agent_options(setting),
            "--source", str(tmp / "src.txt"), "--target", str(tmp / "ref.txt"),
            "--latency-metrics", "AL", "CW", "AP", "DAL", "--quality-metrics", "BLEU",
            "--output", str(tmp / name), "--no-progress-bar"]
        procs[name] = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
    out = {}
    try:
        for name, p in procs.items():
            stdout, stderr = p.communicate(timeout=300)
            out[name] = Namespace(returncode=p.returncode, stdout=stdout, stderr=stderr, dir=tmp / name)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    return out


def read_scores(run) -> dict[str, float]:
    header, values = (run.dir / "scores.tsv").read_text().strip().splitlines()
    return dict(zip(header.split("\t"), map(float, values.split("\t"))))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_simuleval_command_line_completes_and_reports_metrics(simuleval_runs, name):
    run = simuleval_runs[name]
    assert run.returncode == 0, run.stderr[-3000:]
    header, values = run.stdout.strip().splitlines()[-2:]  # SimulEval prints the scores table
    assert header.split() == ["BLEU", "AL", "CW", "AP", "DAL"]
    assert len(values.split()) == 5
    scores = read_scores(run)
    assert set(scores) == {"BLEU", "AL", "CW", "AP", "DAL"}
    assert all(math.isfinite(v) for v in scores.values())
    assert len((run.dir / "instances.log").read_text().splitlines()) == len(SOURCES)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_simuleval_delays_equal_simulate_and_translate(simuleval_runs, trained, trained_decoders,
                                                       tmp_path, name):
    """instances.log (one bundled WriteAction per step) == simulate() == `simulserve translate`."""
    from clients.cli import main

    policy, setting, _ = RUNS[name]
    run = simuleval_runs[name]
    assert run.returncode == 0, run.stderr[-3000:]
    logged = [json.loads(line) for line in (run.dir / "instances.log").read_text().splitlines()]
    expected = simulate(trained_decoders[policy], SOURCES, **setting)
    (tmp_path / "in.txt").write_text("\n".join(SOURCES) + "\n")
    assert main(["translate", "--checkpoint", str(trained[policy]), "--input", str(tmp_path / "in.txt"),
                 "--output", str(tmp_path / "out.jsonl"), "--device", "cpu", *agent_options(setting)]) == 0
    translated = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(logged) == len(expected) == len(translated) == len(SOURCES)
    for log, sim, tr in zip(logged, expected, translated):
        assert log["source"] == sim.source
        assert log["prediction"] == sim.prediction == tr["prediction"]
        assert log["delays"] == sim.delays == tr["delays"]
        assert log["source_length"] == sim.source_words


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_simuleval_scores_equal_our_latency_module(simuleval_runs, trained_decoders, name):
    """SimulEval's printed AL/AP/DAL/CW/BLEU (3 decimals) == models/metrics/latency.py + sacrebleu on simulate()."""
    import sacrebleu

    policy, setting, _ = RUNS[name]
    scores = read_scores(simuleval_runs[name])
    results = simulate(trained_decoders[policy], SOURCES, **setting)
    # like SimulEval, a sentence without output has no latency and is left out
    ours = corpus_scores(sentence_scores(r.delays, r.source_words, len(r.delays), ref_len=len(ref.split(" ")))
                         for r, ref in zip(results, REFERENCES) if r.delays)
    bleu = sacrebleu.corpus_bleu([r.prediction for r in results], [REFERENCES]).score
    assert scores["BLEU"] == pytest.approx(round(bleu, 3), abs=1e-9)
    for m in ("AL", "AP", "DAL", "CW"):
        assert scores[m] == pytest.approx(round(ours.as_dict()[m], 3), abs=1e-9), m


# ------------------------------------------------------------- the agent in-process

def drive(agent, sentence: str, reference: str = "x", states=None):
    """SimulEval 1.1.4's evaluator loop for one sentence, on its own instance class."""
    dl = TextToTextDataloader([sentence + "\n"], [reference + "\n"])
    ins = INSTANCE_TYPE_DICT["text-text"](0, dl, Namespace(eval_latency_unit="word"))
    actions = []
    for _ in range(10 * (len(sentence.split()) + 10)):  # a broken agent would loop forever
        if ins.finish_prediction:
            break
        segment = ins.send_source(1)
        if states is None:
            agent.push(segment)
            out = agent.pop()
        else:
            agent.push(segment, states)
            out = agent.pop(states)
        actions.append((ins.step, out))
        ins.receive_prediction(out)
    else:
        pytest.fail("the agent never finished the sentence")
    if states is None:
        agent.reset()
    return ins, actions


@pytest.mark.parametrize("policy", list(SETTINGS))
def test_agent_bundles_words_and_finishes(trained, trained_decoders, policy):
    agent = SimulAgent.build(trained[policy], **SETTINGS[policy])
    expected = simulate(trained_decoders[policy], SOURCES, **SETTINGS[policy])
    for sentence, sim in zip(SOURCES, expected):
        ins, actions = drive(agent, sentence)
        writes = [(step, seg) for step, seg in actions if not seg.is_empty and seg.content]
        # one action per received word: all words of one delay travel together
        assert [step for step, _ in writes] == sorted(set(sim.delays))
        assert [len(seg.content.split()) for _, seg in writes] == \
            [sim.delays.count(d) for d in sorted(set(sim.delays))]
        assert actions[-1][1].finished and ins.finish_prediction
        assert sum(seg.finished for _, seg in actions) == 1
        assert ins.prediction == sim.prediction and ins.delays == sim.delays
    assert agent.decoder.pool.in_use == 0  # every sentence's cache slot was freed


def test_agent_leaves_out_what_is_past_the_models_positions_and_goes_on(trained, trained_decoders, caplog):
    """A source over the model's positions (48 in the tiny models) stopped a whole SimulEval run with
    SourceTooLong; the words that fit are translated as a sentence of just those words would be, the rest is
    left out with a warning, and the next sentence is unaffected."""
    agent = SimulAgent.build(trained["waitk"], **SETTINGS["waitk"])
    words = (" ".join(SOURCES).split() * 20)[:60]
    with caplog.at_level("WARNING", logger="simulserve.agent"):
        ins, _ = drive(agent, " ".join(words))
    assert "longer than the model's 48 positions (subwords with EOS): from word 48 on" in caplog.text
    fits = simulate(trained_decoders["waitk"], [" ".join(words[:47])], **SETTINGS["waitk"])[0]
    assert ins.finish_prediction and ins.prediction == fits.prediction
    ins, _ = drive(agent, SOURCES[1])
    assert ins.prediction == simulate(trained_decoders["waitk"], [SOURCES[1]], **SETTINGS["waitk"])[0].prediction
    assert agent.decoder.pool.in_use == 0


def test_agent_policy_actions(trained):
    """policy() itself: ReadAction while nothing is complete, WriteAction(finished=True) last."""
    agent = SimulAgent.build(trained["offline"])
    st = agent.build_states()
    st.source, st.source_finished = ["haus", "baum"], False
    assert isinstance(agent.policy(st), ReadAction)  # offline waits for the end
    st.source, st.source_finished = ["haus", "baum", "wald"], True
    action = agent.policy(st)
    assert isinstance(action, WriteAction) and action.finished
    assert action.content.split() == ["haus", "baum", "wald"]
    assert agent.policy(st) == WriteAction("", finished=True)  # asked again: still finished


def test_agent_state_is_per_sentence(trained, trained_decoders):
    """Two sentences driven word by word in alternation, each with its own states object,
    give what each gives alone: the agent itself holds no sentence state."""
    agent = SimulAgent.build(trained["gma"], delta=1.0)
    a, b = SOURCES[1].split(), SOURCES[2].split()
    sa, sb = SimulStates(), SimulStates()
    out = {id(sa): [], id(sb): []}
    for i in range(max(len(a), len(b))):
        for words, st in ((a, sa), (b, sb)):
            if i < len(words):
                st.source.append(words[i])
                st.source_finished = i == len(words) - 1
                action = agent.policy(st)
                if not action.is_read() and action.content:
                    out[id(st)].extend((w, len(st.source)) for w in action.content.split())
    expected = simulate(trained_decoders["gma"], [SOURCES[1], SOURCES[2]], delta=1.0)
    for st, sim in ((sa, expected[0]), (sb, expected[1])):
        assert st.stream.done
        assert [w for w, _ in out[id(st)]] == sim.prediction.split()
        assert [d for _, d in out[id(st)]] == sim.delays


def test_agent_options_and_errors(trained, tmp_path):
    with pytest.raises(AgentError, match="needs a gma checkpoint"):
        GMAAgent.build(trained["waitk"])
    with pytest.raises(PolicyError, match="delta is a GMA setting"):
        WaitKAgent.build(trained["waitk"], delta=1.0)
    with pytest.raises(PolicyError, match="k must be an integer >= 1"):
        SimulAgent.build(trained["waitk"], k=0)
    with pytest.raises(CheckpointError, match="no checkpoint directory"):
        SimulAgent.build(tmp_path / "nowhere")
    agent = WaitKAgent.build(trained["waitk"])  # the checkpoint's default k
    assert agent.policy_setting.k == 2
    agent.to("cpu", fp16=False)  # what SimulEval calls after construction: a no-op here
    assert agent.device == "cpu"


def test_launcher_uses_absolute_imports_only():
    """SimulEval executes an --agent file as a module named `agents`: no relative imports."""
    text = (ROOT / "agents" / "simuleval_agent.py").read_text()
    assert "from ." not in text and "entrypoint(SimulAgent)" in text
    assert "from ." not in (ROOT / "agents" / "simul_agent.py").read_text()
