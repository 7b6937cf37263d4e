"""The one decoding loop of the project: a batched READ/WRITE step over stream states.

`StreamingDecoder.step(states)` runs, for every given stream that can make
progress, one batched encoder step (new source subwords) and one batched
decoder step, and returns READ or WRITE for each. The server's engine, the
SimulEval agents, `simulserve translate`/`evaluate` and the benchmarks all
drive this method; `advance()` is just "step until every stream waits".
"""
from __future__ import annotations

import time

import torch

from models.beam import beam_search
from models.cache_pool import CachePool
from models.packed_linear import PackedLinear, pack_for_inference, plain_copy
from models.policy import Policy, make_policy
from models.stream import DONE, READ, WRITE, SourceTooLong, StepOutput, StreamError, StreamState, TargetWord
from models.tokenizer import Tokenizer
from models.transformer import Transformer

# once the source has ended, a target longer than a * |x| + b is cut with EOS
MAX_LEN_A, MAX_LEN_B = 2, 10


class StreamingDecoder:
    def __init__(self, model: Transformer, tokenizer: Tokenizer, pool: CachePool | None = None,
                 fast: bool = True):
        self.model = model.eval()
        # what the steps run: on CPU a copy with packed linears (models/packed_linear.py), else
        # the model itself; `model` keeps its own weights (saving, moving, training).
        # fast=False: a copy without any fast path, the baseline of `bench step`
        self.net = pack_for_inference(model) if fast else plain_copy(model)
        self.cfg = model.cfg
        self.tok = tokenizer
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.pool = pool or CachePool(self.cfg, p.device, p.dtype)
        # the output projection (the embedding, tied) packed like the other linears where
        # that is available; elsewhere a (d, V) matrix in row order, which a few rows
        # times run faster than F.linear's transposed (V, d) product
        packed = fast and self.net is not model
        self.out_packed = PackedLinear(model.embed.weight, None) if packed else None
        self.out_weight = None if packed else model.embed.weight.detach().t().contiguous()

    def release_model(self) -> None:
        """Forget the caller's model where the steps run a copy of it (a server never saves,
        moves or trains it), so that its weights can be freed; `model` then names the copy."""
        self.model = self.net

    # ---- stream life cycle ------------------------------------------------
    def new_stream(self, k: int | None = None, delta: float | None = None, beam: int = 1,
                   record: bool = False, policy: Policy | None = None) -> StreamState:
        policy = policy or make_policy(self.cfg, k=k, delta=delta, beam=beam)
        s = StreamState(policy=policy, slot=self.pool.allocate())
        if policy.kind == "gma":
            s.gma_running = [0.0] * self.cfg.decoder_layers
        if record:
            s.record = []
        return s

    def close(self, s: StreamState) -> None:
        """Free the stream's cache slot (idempotent)."""
        if s.slot is not None:
            self.pool.release(s.slot)
            s.slot = None

    def push(self, s: StreamState, words: list[str] | str) -> int:
        """Receive source words (a string is split on whitespace); returns words added.

        Received words wait in the stream's inbox; the policy READs them one at a
        time, so the output and its delays do not depend on how words were chunked.
        """
        if s.end_received:
            raise StreamError("the source of this sentence has already ended")
        if isinstance(words, str):
            words = [words]
        parts = []
        for w in words:
            if not isinstance(w, str):
                raise StreamError(f"source words must be strings, got {type(w).__name__}")
            parts.extend(w.split())
        encoded = [self.tok.encode_word(w) for w in parts]
        total = len(s.source_tokens) + sum(len(x) for _, x in s.inbox) + sum(map(len, encoded)) + 1  # + EOS
        if total > self.cfg.max_positions:
            raise SourceTooLong(
                f"sentence too long: {total} subwords with EOS, the model takes at most "
                f"{self.cfg.max_positions}; end the sentence earlier")
        s.inbox.extend(zip(parts, encoded))
        if parts:
            s.blocked = False
        return len(parts)

    def finish(self, s: StreamState) -> None:
        """The sentence's source is complete (once the inbox is read, EOS follows)."""
        s.end_received = True
        s.blocked = False

    # ---- the step -----------------------------------------------------------
    @torch.inference_mode()
    def step(self, states: list[StreamState]) -> list[StepOutput]:
        for s in states:
            if s.slot is None:
                raise StreamError("stream is closed")
        out: list[StepOutput | None] = [None] * len(states)
        compute = []
        for i, s in enumerate(states):
            if s.done:
                out[i] = StepOutput(DONE, finished=True)
            elif s.blocked:
                out[i] = StepOutput(READ)
            elif s.queue:
                out[i] = self._write(s, s.queue.pop(0))
            elif self._must_read(s):
                out[i] = self._read(s, self._quick_need(s))
            elif len(s.target_tokens) >= self._max_target_len(s):
                out[i] = self._write(s, self.cfg.eos_id)
            else:
                compute.append(i)
        # encode only what a decoder step is about to use: words read while the
        # policy waits are encoded together, as one chunk
        self._encode_pending([states[i] for i in compute])
        batch = []
        for i in compute:
            s = states[i]
            if s.policy.kind == "offline" and s.policy.beam > 1:
                s.queue = beam_search(self, s, s.policy.beam, self._max_target_len(s))
                out[i] = self._write(s, s.queue.pop(0))
            else:
                batch.append(i)
        if batch:
            for i, o in zip(batch, self._decode([states[i] for i in batch])):
                out[i] = o
        return out

    def scores(self, hidden: torch.Tensor) -> torch.Tensor:
        """Output logits (B, V) of top decoder states (B, d): Transformer.logits, computed faster."""
        if self.out_packed is not None:
            return self.out_packed(hidden)
        return hidden @ self.out_weight

    def advance(self, states: list[StreamState], compute: list[float] | None = None) -> list[list[StepOutput]]:
        """Step until every stream waits for the client or is done; the WRITEs per stream.
        `compute[i]`, if given, accumulates stream i's share of each batched step's time."""
        results = [[] for _ in states]
        active = [i for i, s in enumerate(states) if not (s.done or s.blocked)]
        while active:
            t0 = time.perf_counter()
            outs = self.step([states[i] for i in active])
            if compute is not None:
                share = (time.perf_counter() - t0) / len(active)
                for i in active:
                    compute[i] += share
            for i, o in zip(active, outs):
                if o.action == WRITE:
                    results[i].append(o)
            active = [i for i in active if not (states[i].done or states[i].blocked)]
        return results

    # ---- internals ------------------------------------------------------------
    def _must_read(self, s: StreamState) -> bool:
        """READ decisions that need no model compute. GMA's needs the decoder once; a
        blocked trial records how much source it needs (`s.need`: the first blocking
        layer's window, which more source cannot change), so until that much has
        arrived the answer is READ again without recomputing it."""
        if s.source_finished:
            return False
        if s.available < s.need:
            return True
        if s.policy.kind == "offline":
            return True
        if s.policy.kind == "waitk":
            return len(s.target_tokens) + s.policy.k > s.available
        return False

    def _quick_need(self, s: StreamState) -> float:
        # s.need: what the last decoder trial asked for (a GMA window, or one more word after
        # an early EOS), never less than the policy's own rule
        if s.policy.kind == "waitk":
            return max(len(s.target_tokens) + s.policy.k, s.need)
        if s.policy.kind == "gma":
            return s.need
        return float("inf")  # offline: the whole sentence

    def _read(self, s: StreamState, need: float) -> StepOutput:
        """READ: take words from the inbox until `need` source positions are there
        (several READs in a row, done at once), the end of the source once the inbox
        is empty and the sentence ended, else wait for the client (blocked)."""
        moved = False
        while s.available < need and s.inbox:
            word, ids = s.inbox.pop(0)
            s.source_words.append(word)
            s.source_tokens.extend(ids)
            moved = True
        if s.available < need and not s.inbox and s.end_received and not s.source_finished:
            s.source_finished = True
            moved = True
        s.blocked = not moved
        return StepOutput(READ)

    def _max_target_len(self, s: StreamState) -> int:
        cap = self.cfg.max_positions - 1
        if s.source_finished:
            cap = min(cap, MAX_LEN_A * s.available + MAX_LEN_B)
        return cap

    def _encode_pending(self, states: list[StreamState]) -> None:
        todo = [s for s in states if s.n_encoded < s.available and not s.done
                and (self.cfg.causal_encoder or s.source_finished)]
        if not todo:
            return
        eos = self.cfg.eos_id
        new = [(s.source_tokens + [eos] * s.source_finished)[s.n_encoded:s.available] for s in todo]
        n_new = torch.tensor([len(x) for x in new], device=self.device)
        start = torch.tensor([s.n_encoded for s in todo], device=self.device)
        tokens = torch.full((len(todo), int(n_new.max())), self.cfg.pad_id, device=self.device)
        for r, x in enumerate(new):
            tokens[r, : len(x)] = torch.tensor(x, device=self.device)
        slots = torch.tensor([s.slot for s in todo], device=self.device)
        valid = torch.arange(tokens.shape[1], device=self.device).view(1, -1) < n_new.view(-1, 1)
        bi, ii = valid.nonzero(as_tuple=True)
        pos = start[bi] + ii
        if self.cfg.causal_encoder:
            caches = self.pool.gather_kv("enc", slots, int(start.max()))
            enc, new_kv = self.net.encode_chunk(tokens, start, n_new, caches)
            for layer, (k, v) in enumerate(new_kv):
                self.pool.write("enc_k", layer, slots[bi], pos, k[bi, :, ii])
                self.pool.write("enc_v", layer, slots[bi], pos, v[bi, :, ii])
        else:  # bidirectional: the whole sentence at once, after it ended
            enc = self.net.encode(tokens, n_new)
        for layer, (k, v) in enumerate(self.net.cross_kv(enc)):
            self.pool.write("cross_k", layer, slots[bi], pos, k[bi, :, ii])
            self.pool.write("cross_v", layer, slots[bi], pos, v[bi, :, ii])
        for layer, mk in enumerate(self.net.mask_keys(enc) or []):
            self.pool.write("cross_mk", layer, slots[bi], pos, mk[bi, :, ii])
        for s in todo:
            s.n_encoded = s.available

    def _decode(self, states: list[StreamState]) -> list[StepOutput]:
        dev, cfg = self.device, self.cfg
        slots = torch.tensor([s.slot for s in states], device=dev)
        t = torch.tensor([len(s.target_tokens) for s in states], device=dev)
        prev = torch.tensor([s.target_tokens[-1] if s.target_tokens else cfg.bos_id for s in states], device=dev)
        avail = torch.tensor([s.available for s in states], device=dev)
        finished = torch.tensor([s.source_finished for s in states], device=dev)
        k = delta = running = None
        if cfg.attention == "waitk":
            k = torch.tensor([s.policy.k for s in states], device=dev)
        elif cfg.attention == "gma":
            delta = torch.tensor([s.policy.delta for s in states], device=dev, dtype=torch.float32)
            running = torch.tensor([s.gma_running for s in states], device=dev, dtype=torch.float32)
        mask_caches = contexts = None
        if cfg.variant.kind == "calibration":
            mask_caches = self.pool.gather("cross_mk", slots, int(avail.max()))
        elif cfg.variant.carries_context:
            contexts = torch.stack([self._carried_context(s) for s in states])
        hidden, new_kv, info = self.net.decode_step(
            prev, t, self.pool.gather_kv("dec", slots, int(t.max())),
            self.pool.gather_kv("cross", slots, int(avail.max())), avail, finished, k, delta, running,
            need_weights=any(s.record is not None for s in states), mask_caches=mask_caches, contexts=contexts)
        read = info["read"].tolist()
        need = info["need"].tolist()
        keep = torch.tensor([not r for r in read], device=dev)
        tokens = torch.zeros(len(states), dtype=torch.long, device=dev)
        if keep.any():  # no output projection for trials that READ
            tokens[keep] = self.scores(hidden[keep]).argmax(-1)
        tokens = tokens.tolist()
        for r, s in enumerate(states):
            if not read[r] and tokens[r] == cfg.eos_id and not s.source_finished:
                # EOS before the source has ended is a READ (the reference agents' rule): a
                # translation ends with its sentence, not while the speaker is still talking
                read[r], need[r] = True, s.available + 1
        # every row writes its decoder keys at t: a READ does not advance t, so its keys are rewritten
        # by the step that finally WRITEs there before any step reads position t (no mask, no sync)
        for layer, (kk, vv) in enumerate(new_kv):
            self.pool.write("dec_k", layer, slots, t, kk[:, :, 0])
            self.pool.write("dec_v", layer, slots, t, vv[:, :, 0])
        outs = []
        sums = info["running"].tolist() if "running" in info else None  # one conversion, not one per stream
        for r, s in enumerate(states):
            if read[r]:
                s.need = need[r]
                outs.append(self._read(s, need[r]))
                continue
            if sums is not None:
                s.gma_running = sums[r]
            if "context" in info:  # SACT: only a written step moves c̃ on
                s.carried_context = info["context"][r]
            if s.record is not None:
                s.record.append({"n": info["n"][r].tolist(),
                                 "p": info["p"][r].tolist() if "p" in info else None,
                                 "attention": [a[r].mean(0)[: s.available].tolist() for a in info["attention"]]})
            outs.append(self._write(s, tokens[r]))
        return outs

    def _carried_context(self, s: StreamState) -> torch.Tensor:
        if s.carried_context is None:  # c̃ before the first target step: zeros
            s.carried_context = torch.zeros(self.cfg.decoder_layers, self.cfg.d_model, device=self.device,
                                         dtype=self.dtype)
        return s.carried_context

    def _write(self, s: StreamState, token: int) -> StepOutput:
        """Commit one target token; release the words it completes."""
        s.target_tokens.append(token)
        s.token_delays.append(s.available)
        released = []
        eos = token == self.cfg.eos_id
        if s.pending and (eos or self.tok.starts_word(token)):
            word = self._release(s)
            if word.text:  # a lone "▁" piece makes no word
                released.append(word)
        if eos:
            s.done = True
        else:
            s.pending.append(token)
        s.words.extend(released)
        return StepOutput(WRITE, token, released, finished=s.done)

    def _release(self, s: StreamState) -> TargetWord:
        text = self.tok.decode(s.pending).strip()
        s.pending = []
        return TargetWord(text, len(s.source_words), s.available)
