"""SimulEval 1.1.4 text-to-text agents for simulserve checkpoints (GMA, wait-k, offline).

The agent is a thin adapter around the project's one decoding loop,
`models.step.StreamingDecoder`: on every SimulEval step it pushes the source
word(s) received since the last step into the sentence's stream, runs
`advance` (READ/WRITE steps until the stream waits for more source or is
done) and answers with ONE action:

- the stream wrote complete target words -> one `WriteAction("w1 w2 ...")`
  bundling all of them (SimulEval takes one action per received word and
  charges every word of the action the same delay; separate actions would add a
  source word of delay to each extra word);
- the stream is done (target EOS) -> `WriteAction(words, finished=True)`;
- nothing complete yet -> `ReadAction()`.

The delays SimulEval logs are therefore exactly the word delays of
`simulserve translate` / `models.translate.simulate` for the same sentence.

Per-sentence state lives on the SimulEval states object (`SimulStates.stream`),
not on the agent: the loaded model is shared, the policy is stateless
(`policy(states)`), so several sentences can be driven at once with separate
states objects.

Run it (from the repository root, `agents` and `models` importable, e.g.
`PYTHONPATH=.` or `pip install -e .`):

    simuleval --agent agents/simuleval_agent.py --user-dir agents \
        --checkpoint CKPT [--k K | --delta D] \
        --source SRC --target REF --latency-metrics AL CW AP DAL --output DIR

or `--agent-class agents.simul_agent.SimulAgent` instead of `--agent ...`.
This file uses absolute imports only: SimulEval executes an `--agent` file as a
stand-alone module named `agents`.
"""
from __future__ import annotations

import logging
from argparse import ArgumentParser, Namespace

from simuleval.agents import TextToTextAgent
from simuleval.agents.actions import ReadAction, WriteAction
from simuleval.agents.states import AgentStates

import agents.scorers  # noqa: F401  (registers the CW scorer with SimulEval)
from models.checkpoint import load_checkpoint, pick_device
from models.errors import UserError
from models.policies import make_policy
from models.shipped import resolve_checkpoint
from models.step import StreamingDecoder
from models.decoding import add_decoding_arguments, decoding_options
from models.step_form import add_step_argument
from models.stream import SourceTooLong

log = logging.getLogger("simulserve.agent")


class AgentError(UserError):
    """The agent cannot run with these options (wrong checkpoint kind, ...)."""


class SimulStates(AgentStates):
    """SimulEval's states plus the sentence's simulserve stream."""

    def reset(self) -> None:
        super().reset()
        self.stream = None    # models.stream.StreamState of the current sentence
        self.n_pushed = 0     # source segments already pushed into the stream
        self.dropped = 0      # source words left out: past the model's positions (SimulAgent._push)


class SimulAgent(TextToTextAgent):
    """Any simulserve checkpoint; the policy (GMA / wait-k / offline) comes from its config."""

    expected_policy: str | None = None  # subclasses pin the checkpoint kind

    def __init__(self, args: Namespace) -> None:
        self.checkpoint = str(resolve_checkpoint(args.checkpoint))
        device = pick_device(getattr(args, "device", None))
        model, tok, _ = load_checkpoint(self.checkpoint, device)
        kind = model.cfg.policy
        if self.expected_policy and kind != self.expected_policy:
            raise AgentError(f"{type(self).__name__} needs a {self.expected_policy} checkpoint, "
                             f"{self.checkpoint} is a {kind} model (use SimulAgent)")
        # validated once, up front: a bad --k/--delta fails before the first sentence
        self.policy_setting = make_policy(model.cfg, k=getattr(args, "k", None),
                                          delta=getattr(args, "delta", None),
                                          beam=getattr(args, "beam", None) or 1)
        self.tokenizer = tok
        self.step_form = getattr(args, "step", None) or "default"
        self.options = decoding_options(args)
        self.decoder = StreamingDecoder(model, tok, form=self.step_form, options=self.options)
        super().__init__(args)  # builds self.states and resets them
        self.device = str(device)

    # ---- SimulEval hooks ---------------------------------------------------
    @staticmethod
    def add_args(parser: ArgumentParser) -> None:
        parser.add_argument("--checkpoint", required=True,
                            help="simulserve checkpoint directory or shipped model name")
        parser.add_argument("--k", type=int, default=None,
                            help="wait-k lag (wait-k checkpoints; default: the checkpoint's)")
        parser.add_argument("--delta", type=float, default=None,
                            help="GMA relaxation offset δ (GMA checkpoints; default: the checkpoint's)")
        parser.add_argument("--beam", type=int, default=1, help="beam size (offline checkpoints)")
        add_step_argument(parser)
        add_decoding_arguments(parser)
        # --device (cpu, cuda, cuda:1, auto) and --dtype/--fp16 are SimulEval's own options

    @classmethod
    def build(cls, checkpoint, k: int | None = None, delta: float | None = None,
              beam: int = 1, device: str = "cpu", step: str = "default") -> "SimulAgent":
        """Construct without a command line (tests, notebooks)."""
        return cls(Namespace(checkpoint=str(checkpoint), k=k, delta=delta, beam=beam, device=device, step=step))

    def build_states(self) -> SimulStates:
        return SimulStates()

    def reset(self) -> None:
        self._close(self.states)
        super().reset()

    def to(self, device: str, *args, fp16: bool = False, **kwargs) -> None:
        """SimulEval calls this with its --device and --fp16/--dtype after construction."""
        import torch
        dev = pick_device(device)
        dtype = torch.float16 if fp16 else torch.float32
        p = next(self.decoder.model.parameters())
        if p.device == dev and p.dtype == dtype:
            return
        self._close(self.states)
        self.decoder = StreamingDecoder(self.decoder.model.to(device=dev, dtype=dtype), self.tokenizer,
                                        form=self.step_form, options=self.options)
        self.device = str(dev)

    def policy(self, states: SimulStates | None = None):
        st = self.states if states is None else states
        dec = self.decoder
        if st.stream is None:
            st.stream = dec.new_stream(policy=self.policy_setting)
            st.n_pushed = 0
        s = st.stream
        if s.done:  # already answered finished=True; SimulEval should not ask again
            return WriteAction("", finished=True)
        new = st.source[st.n_pushed:]
        if new:
            self._push(st, [w for w in new if w])
            st.n_pushed = len(st.source)
        if st.source_finished and not s.end_received:
            dec.finish(s)
        outputs = dec.advance([s])[0]
        text = " ".join(w.text for o in outputs for w in o.words)
        if s.done:
            dec.close(s)  # free the cache slot now; the state keeps the finished stream
            return WriteAction(text, finished=True)
        if st.source_finished:  # cannot happen: a finished source always ends the target
            raise RuntimeError("the stream waits for source after the source ended")
        return WriteAction(text, finished=False) if text else ReadAction()

    # ---- helpers -------------------------------------------------------------
    def _push(self, st: SimulStates, words: list[str]) -> None:
        """The sentence's new words into its stream; past the model's positions the rest of the sentence is left
        out with a warning (as the server refuses such words), instead of stopping a whole evaluation there."""
        dec, s = self.decoder, st.stream
        if st.dropped:
            st.dropped += len(words)
            return
        try:
            dec.push(s, words)
            return
        except SourceTooLong:
            pass
        for i, w in enumerate(words):   # (as many as fit, one by one)
            try:
                dec.push(s, [w])
            except SourceTooLong:
                st.dropped = len(words) - i
                break
        log.warning("a source sentence is longer than the model's %d positions (subwords with EOS): from word %d "
                    "on it is not translated", self.decoder.cfg.max_positions,
                    len(s.source_words) + len(s.inbox) + 1)

    def _close(self, st) -> None:
        s = getattr(st, "stream", None)
        if s is not None:
            self.decoder.close(s)


class GMAAgent(SimulAgent):
    """SimulAgent that insists on a GMA checkpoint (option: --delta)."""
    expected_policy = "gma"


class WaitKAgent(SimulAgent):
    """SimulAgent that insists on a wait-k checkpoint (option: --k)."""
    expected_policy = "waitk"


class OfflineAgent(SimulAgent):
    """SimulAgent that insists on an offline checkpoint (reads the whole sentence; --beam)."""
    expected_policy = "offline"
