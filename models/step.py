"""The one decoding loop of the project: a batched READ/WRITE step over stream states.

`StreamingDecoder.step(states)` runs, for every given stream that can make
progress, one batched encoder step (new source subwords) and one batched
decoder step, and returns READ or WRITE for each. The server's engine, the
SimulEval agents, `simulserve translate`/`evaluate` and the benchmarks all
drive this method; `advance()` is just "step until every stream waits".
"""
from __future__ import annotations

import functools
import struct
import time
from dataclasses import dataclass, field

import torch

from models.beam import beam_search
from models.cache_pool import CachePool
from models.decode_io import DecodeInput, DecodeOutput
from models.decoding import DecodingOptions, StutterContext, banning_filters, filter_bans, token_filters
from models.graph_inputs import Readback
from models.int8_linear import Int8GemvLinear, Int8Linear
from models.packed_linear import (GemvLinear, PackedLinear, fuse_projections, pack_for_inference, packing_available,
                                  plain_copy)
from models.policies import Policy, make_policy
from models.step_form import StepForm, StepFormError, step_form
from models.stream import (DONE, READ_OUTPUT, WRITE, SourceTooLong, StepOutput, StreamError, StreamState,
                           TargetWord)
from models.tokenizer import Tokenizer
from models.transformer import Transformer
from models.upload import Upload

# once the source has ended, a target longer than a * |x| + b is cut with EOS
MAX_LEN_A, MAX_LEN_B = 2, 10
# the encoder chunk widths (new subwords per stream in one step) the graphs-encoder form captures: a word or a
# few read while the policy waited (1-8), and a whole sentence or chat message pushed at once (16-64: one such
# row in a step made the whole step's encoder run eagerly, every step of a server flooded with whole sentences);
# wider chunks run eagerly
ENCODER_WIDTHS = [1, 2, 4, 8, 16, 32, 64]


def _bits(value: float) -> int:
    """A float's float64 bit pattern as an int (Upload carries int64; SlotState.reset_rows views it back)."""
    return struct.unpack("<q", struct.pack("<d", float(value)))[0]


def inference(fn):
    """torch.inference_mode() around `fn`, entered only when it is off: a loop that steps inside inference mode
    (the engine thread, `simulate`) pays a flag test a call instead of building and entering a context manager
    (about 2 µs a call, twice a step: a few % of a small step's host time on a GPU)."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        if torch.is_inference_mode_enabled():
            return fn(*args, **kwargs)
        with torch.inference_mode():
            return fn(*args, **kwargs)
    return run


@dataclass
class PendingStep:
    """A step `launch`ed and not yet `collect`ed: the outputs decided on the host, and for the rows the decoder
    decides (`batch`, indices into `states`) its queued decisions."""
    states: list[StreamState]
    out: list[StepOutput | None]
    batch: list[int] = field(default_factory=list)
    rows: list[StreamState] = field(default_factory=list)   # states[i] for i in batch
    decided: torch.Tensor | None = None       # (len(batch), 3): on the CPU, or (CUDA) its pinned copy
    readback: tuple | None = None             # CUDA: the pinned buffer `decided` views and its event (Readback)
    record: DecodeOutput | None = None        # the trial's DecodeOutput where a stream records (plots)


class StreamingDecoder:
    def __init__(self, model: Transformer, tokenizer: Tokenizer, pool: CachePool | None = None,
                 form: str | StepForm = "default", options: DecodingOptions | None = None):
        self.model = model.eval()
        # the decoding rules, with the policy's defaults filled in
        self.options = (options or DecodingOptions()).for_policy(model.cfg.policy)
        # the decoding rules as filters, applied in one place (_choose); those that ban tokens per row
        # run on the host while the step is planned
        self.filters = token_filters(self.options, model.cfg.eos_id)
        self.banning = banning_filters(self.options)
        self.needs_source = any(f.uses_context for f in self.banning)   # the no-stutter rule reads the source
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        # how the steps run (models/step_form.py): chosen once, checked against the device;
        # `auto` times the candidate forms here (models/step_choice.py)
        self.choice = None
        if step_form(form).linears == "auto":
            from models.step_choice import choose
            self.choice = choose(model, tokenizer, options)
            form = self.choice.form
        self.form = step_form(form).resolve(p.device, p.dtype)
        self.compiled = self.form.compiled
        self.sync_free = self.form.sync_free
        # what the steps run: for `packed`/`int8` a copy with packed (or int8) linears where
        # that is available, else the model itself; `fused` a copy whose projections of one input are one product
        # each (what torch.compile traces for graphs-fused); `model` keeps its own weights (saving, moving,
        # training). compiled: torch.compile traces the model's own linears
        linears = self.form.linears
        self.net = (model if linears == "model" else plain_copy(model) if linears == "plain"
                    else fuse_projections(model) if linears == "fused"
                    else pack_for_inference(model, int8=linears in ("int8", "int8-gemv"),
                                            gemv=linears in ("gemv", "int8-gemv")))
        self.cfg = model.cfg
        self.tok = tokenizer
        self.pool = pool or CachePool(self.cfg, p.device, p.dtype)
        self.decode_fn = self.net.decode_step
        self.encode_chunk_fn = self.net.encode_chunk   # (the captured encoder chunk step's: _encode_core)
        self.settle_fn = self._settle                  # (what a decoder trial decided: _decode_core)
        self.scratch = None
        self._scratch_change = self._scratch_fresh = None   # (its padding rows: _static_shapes)
        self.graphs = None   # models/cuda_graphs.py: the decoder step's captured graphs (capture_graphs)
        self.readback = Readback()   # pinned buffers the decisions come back in (CUDA)
        self.wait_seconds: float | None = None   # a benchmark's host seconds waiting for the read back (None: untimed)
        # the slot fields a new stream's policy sets (one policy class per model: the same for every stream)
        self.slot_names = list(make_policy(self.cfg).slot_values())
        if self.form.static_shapes:
            self._static_shapes()
        if self.compiled:
            # (with graphs of our own, inductor only fuses: its own CUDA graphs record lazily, on live traffic)
            mode = "reduce-overhead" if self.device.type == "cuda" and not self.form.graphs else "default"
            # the model's float attributes (attention scales, layer-norm eps, GMA's P_MIN) are constants of its
            # config: traced as such, not as inputs that dynamo makes into tensors from Python values on every call
            # (4-5 uploads a step: host work, and inside a CUDA capture a copy the capture may refuse)
            torch._dynamo.config.specialize_float = True
            if self.form.graphs:
                # every shape a graph is captured for is compiled for at start-up. Sizes that happen to be equal
                # (a batch of 8 with a chunk 8 wide) shared one symbol ("duck" shapes) and compiled again when they
                # differed: 19 variants of the two steps for gma_delta1 at 64 streams, 12 without. Batch 1 and wider,
                # chunk width 1 and wider (0/1 specialisation) and caches with and without room (a Python bool) still
                # compile apart: 8 variants of the encoder's chunk step, dynamo's default limit, beyond which it
                # would run the rest eagerly without saying so (capture makes that an error: cuda_graphs.py)
                import torch.fx.experimental._config as fx_config
                fx_config.use_duck_shape = False
                torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            self.decode_fn = torch.compile(self.net.decode_step, dynamic=True, mode=mode)
            if self.form.graphs:
                # what the decisions and the moved rows take after the decoder step: a dozen elementwise kernels
                self.settle_fn = torch.compile(self._settle, dynamic=True)
            if self.form.graph_encoder and self.cfg.causal_encoder:
                # the encoder's chunk step fused as well: its graphs hold 60-odd small kernels eagerly
                self.encode_chunk_fn = torch.compile(self.net.encode_chunk, dynamic=True)
        # the output projection (the embedding, tied) packed or int8 like the other linears where
        # that is available; elsewhere a (d, V) matrix in row order, which a few rows
        # times run faster than F.linear's transposed (V, d) product
        packed = linears in ("packed", "int8", "gemv", "int8-gemv") and packing_available(p.device, p.dtype)
        out_kind = {"int8": Int8Linear, "gemv": GemvLinear, "int8-gemv": Int8GemvLinear}.get(linears, PackedLinear)
        self.out_packed = out_kind(model.embed.weight, None) if packed else None
        self.out_weight = None if packed else model.embed.weight.detach().t().contiguous()

    def _static_shapes(self) -> None:
        """Few shapes for a compiled decoder step: batches padded to a power of two with rows of
        a scratch slot (a slot no stream owns: whatever they write lands there), cache lengths
        to a power of two (`bucket`). On CUDA, mode "reduce-overhead" records one CUDA graph per
        shape and replays it; elsewhere inductor's default. No host shortcut may break the
        graph: the form runs sync-free."""
        self.scratch = self.pool.allocate()
        rows = self.pool.rows   # a finished one-position source that never advances (see _decode)
        rows.clear(self.scratch)
        rows.prev[self.scratch].fill_(self.cfg.bos_id)
        rows.avail[self.scratch].fill_(1)
        rows.finished[self.scratch].fill_(True)
        # the rows a captured step writes for its padding: the scratch slot's values as set here
        self._scratch_change = [self.scratch, 0, self.cfg.bos_id, 1, 1]
        self._scratch_fresh = [self.scratch] + [_bits(0.0)] * len(self.slot_names)

    def describe_form(self) -> dict:
        """The form the steps run, and for `auto` how it was chosen (/v1/models, the benchmarks)."""
        d = self.form.describe()
        if self.choice is not None:
            d["choice"] = self.choice.describe()
        return d

    def bucket(self, n: int) -> int:
        """The cache length a static-shape step pads `n` to (the exact length otherwise)."""
        if self.scratch is None:
            return n
        # (the next power of two from 8: every step buckets its lengths, a loop of doublings cost more)
        return min(8 if n <= 8 else 1 << (n - 1).bit_length(), self.cfg.max_positions)

    def capture_graphs(self, capacity: int, max_batch: int, widths: list[int] | None = None) -> dict:
        """The `graphs` form, once, before any stream: a fixed pool of `capacity` stream slots (plus the
        scratch slot), then every padded batch size up to `max_batch` and every cache length captured
        (models/cuda_graphs.py); graphs-encoder also every encoder chunk width in `widths` (default
        ENCODER_WIDTHS, those within max_positions). Returns what the capture took (graphs, seconds, device bytes)."""
        from models.cuda_graphs import DecoderGraphs, powers_of_two
        if not self.form.graphs:
            raise StepFormError(f"step form {self.form.name!r} captures no graphs (use --step graphs)")
        if self.banning:
            raise StepFormError("the graphs form needs no_repeat_ngram and no_stutter off: their bans are "
                                "planned on the host per row")
        if self.graphs is not None:
            raise StepFormError("the model's graphs were captured already; capture happens once, at start-up")
        if self.streams_in_cache:
            raise StepFormError("graphs are captured before any stream starts")
        if self.device.type == "cuda":   # the whole pool is allocated now: say so plainly if it cannot be
            need, free = (capacity + 1) * self.pool.bytes_per_slot(), torch.cuda.mem_get_info(self.device)[0]
            if need > 0.9 * free:
                raise StepFormError(f"the graphs form allocates its cache for every stream at start-up: {capacity} "
                                    f"streams need {need / 2**30:.1f} GiB, and {free / 2**30:.1f} GiB of "
                                    f"{self.device} is free; lower --max-streams")
        self.pool = CachePool(self.cfg, self.device, self.dtype, capacity=capacity + 1, fixed=True)
        self._static_shapes()
        lengths = sorted({self.bucket(n) for n in powers_of_two(self.cfg.max_positions, 8)})
        graphs = DecoderGraphs(self, powers_of_two(max_batch), lengths,
                               widths=[w for w in widths or ENCODER_WIDTHS if w <= self.cfg.max_positions]
                               if self.form.graph_encoder else None)
        stats = graphs.capture()
        self.graphs = graphs
        return stats

    @property
    def streams_in_cache(self) -> int:
        """Cache slots held by streams (the static-shape scratch slot is not a stream's)."""
        return self.pool.in_use - (self.scratch is not None)

    def release_model(self) -> None:
        """Forget the caller's model where the steps run a copy of it (a server never saves,
        moves or trains it), so that its weights can be freed; `model` then names the copy."""
        self.model = self.net

    # ---- stream life cycle ------------------------------------------------
    def new_stream(self, k: int | None = None, delta: float | None = None, beam: int = 1,
                   record: bool = False, policy: Policy | None = None) -> StreamState:
        policy = policy or make_policy(self.cfg, k=k, delta=delta, beam=beam)
        # no device work here: the slot's rows are reset by the stream's first decoder trial, with every other
        # new stream's at once (fresh; t, prev, avail, finished come with its first upload: dirty)
        s = StreamState(policy=policy, slot=self.pool.allocate())
        if record:
            s.record = []
        return s

    def close(self, s: StreamState) -> None:
        """Free the stream's cache slot (idempotent)."""
        if s.slot is not None:
            self.pool.release(s.slot)
            s.slot = None

    def push(self, s: StreamState, words: list[str] | str, encoded: list[list[int]] | None = None) -> int:
        """Receive source words (a string is split on whitespace); returns words added. `encoded`: each word's
        subwords (`tok.encode_word`) where the caller has them already (the server's length check), for words
        without whitespace; else they are encoded here.

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
        if encoded is None or len(encoded) != len(parts):   # (a word held whitespace: split here, encode here)
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
    @inference   # (once for both halves)
    def step(self, states: list[StreamState]) -> list[StepOutput]:
        """One step of `states`: what each does (READ, WRITE, DONE), its state moved on."""
        return self.collect(self.launch(states))

    @inference
    def launch(self, states: list[StreamState]) -> PendingStep:
        """The first half of `step`: every decision that needs no model, made, and the batch's encoder and decoder
        work queued on the device; `collect` takes the decoder's decisions. Between the two the states are in
        flight: no other launch may take them. On CUDA the decisions are copied to pinned host memory behind the
        queued kernels, so that the caller can do other host work (an earlier step's results, another batch's
        planning) while the device runs, and `collect` waits only for what is left (server/engine.py overlap)."""
        for s in states:
            if s.slot is None:
                raise StreamError("stream is closed")
            if s.in_flight:
                raise StreamError("stream is in a step that was launched and not yet collected")
        out: list[StepOutput | None] = [None] * len(states)
        batch, beams = [], []   # indices of the rows the decoder decides, in one batch or by beam search
        # READ decisions that need no model compute: GMA's needs the decoder once; a blocked trial records how much
        # source it needs (`s.need`: the first blocking layer's window, which more source cannot change), so until
        # that much has arrived the answer is READ again without recomputing it; then the policy's own rule. (This
        # loop runs for every row of every step: _max_target_len is inlined.)
        eos, cap = self.cfg.eos_id, self.cfg.max_positions - 1
        for i, s in enumerate(states):
            if s.done:
                out[i] = StepOutput(DONE, finished=True)
            elif s.blocked:
                out[i] = READ_OUTPUT
            elif s.queue:
                out[i] = self._write(s, s.queue.pop(0))
            else:
                finished = s.source_finished
                available = len(s.source_tokens) + finished
                if not finished and (available < s.need or s.policy.must_read(s)):
                    # s.need: what the last decoder trial asked for (a GMA window, or one more word after an
                    # early EOS), never less than the policy's own rule
                    out[i] = self._read(s, s.policy.need(s))
                elif len(s.target_tokens) >= (min(cap, MAX_LEN_A * available + MAX_LEN_B) if finished else cap):
                    out[i] = self._write(s, eos)
                elif s.policy.beam > 1:
                    beams.append(i)
                else:
                    batch.append(i)
        pending = PendingStep(states, out)
        if not batch and not beams:
            return pending
        rows = [states[i] for i in batch]
        # encode only what a decoder step is about to use: words read while the policy waits
        # are encoded together, as one chunk. Everything the step needs from the host goes
        # to the device in one copy (the encoder's new subwords and the decoder's rows)
        upload = Upload(self.graphs.inputs if self.graphs is not None else None)
        todo, enc_shape = self._plan_encode(rows + [states[i] for i in beams] if beams else rows, upload)
        record = any(s.record is not None for s in rows)   # (a diagnostic for plots: its trial runs eagerly)
        if batch:
            lengths = self._plan_decode(rows, upload, record)
        sent = upload.send(self.device)
        if todo:
            self._encode(todo, sent, enc_shape)
        for i in beams:
            s = states[i]
            s.queue = beam_search(self, s, s.policy.beam, self._max_target_len(s))
            out[i] = self._write(s, s.queue.pop(0))
        if batch:
            # (the padded rows' decisions come along: reading a few more values back costs less than a slice
            # operator here, and `_results` zips them away)
            decided, pending.record = self._launch_decode(rows, sent, *lengths, record)
            if self.device.type == "cuda":   # (into a reused pinned buffer: the copy runs behind the queued kernels)
                pending.decided, pending.readback = self.readback.start(decided)
            else:
                pending.decided = decided
            pending.batch, pending.rows = batch, rows
            for s in rows:
                s.in_flight = True
        return pending

    @inference
    def collect(self, pending: PendingStep) -> list[StepOutput]:
        """The second half of `step`: the decoder's decisions read back (the one copy back; on a GPU the wait for
        the kernels) and applied to their streams; what each stream of the launched step did."""
        if pending.batch:
            rows = pending.rows
            try:
                decided = self._read_back(pending)
            finally:
                for s in rows:
                    s.in_flight = False
            self._results(rows, decided, pending.record, pending.batch, pending.out)
        return pending.out

    def scores(self, hidden: torch.Tensor) -> torch.Tensor:
        """Output logits (B, V) of top decoder states (B, d): Transformer.logits, computed faster."""
        if self.out_packed is not None:
            return self.out_packed(hidden)
        return hidden @ self.out_weight

    @inference
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
    def _read(self, s: StreamState, need: float) -> StepOutput:
        """READ: take words from the inbox until `need` source positions are there
        (several READs in a row, done at once), the end of the source once the inbox
        is empty and the sentence ended, else wait for the client (blocked)."""
        inbox, available = s.inbox, len(s.source_tokens) + s.source_finished   # (= s.available)
        moved = False
        unk = self.tok.unk_id
        while available < need and inbox:
            word, ids = inbox.pop(0)
            s.source_words.append(word)
            s.source_tokens.extend(ids)
            if unk in ids:
                s.source_unknown.extend(self.tok.unknown_runs(word, ids))
            available += len(ids)
            moved = True
        if available < need and not inbox and s.end_received and not s.source_finished:
            s.source_finished = True
            moved = True
        s.blocked = not moved
        if moved:
            s.dirty = True   # the device's copy of avail/finished is behind (models/slot_state.py)
        return READ_OUTPUT

    def _max_target_len(self, s: StreamState) -> int:
        cap = self.cfg.max_positions - 1
        if s.source_finished:
            cap = min(cap, MAX_LEN_A * s.available + MAX_LEN_B)
        return cap

    def _plan_encode(self, states: list[StreamState], upload: Upload
                     ) -> tuple[list[StreamState], tuple[int, int, int] | None]:
        """The streams with source positions to encode, and the captured (batch, width, cache length) their
        chunk step pads to (None: it runs eagerly); their subwords and cache positions are added to `upload`
        (host lists: no device work yet)."""
        causal = self.cfg.causal_encoder   # (every row of every step: s.available inlined)
        todo = [s for s in states if s.n_encoded < len(s.source_tokens) + s.source_finished and not s.done
                and (causal or s.source_finished)]
        if not todo:
            return todo, None
        eos = [self.cfg.eos_id]
        # the positions not yet encoded, up to s.available: the subwords past n_encoded, and EOS once the source ended
        new = [s.source_tokens[s.n_encoded:] + eos if s.source_finished else s.source_tokens[s.n_encoded:]
               for s in todo]
        width = max(map(len, new))
        rows = [[s.slot, s.n_encoded, len(x)] for s, x in zip(todo, new)]
        shape = (self.graphs.encoder_shape(len(todo), width, max(s.n_encoded for s in todo))
                 if self.graphs is not None and self.graphs.widths else None)
        pad = self.cfg.pad_id
        if shape is not None:   # a captured encoder step: its inputs in place, padded rows (the scratch slot) and width
            batch, width, length = shape
            at = self.graphs.inputs.encoder(batch, width)
            upload.place("enc_tokens", at[0], [x + [pad] * (width - len(x)) for x in new], (batch, width), pad)
            upload.place("enc_rows", at[1], rows, (batch, 3), [self.scratch, 0, 0])
            return todo, shape
        upload.add("enc_tokens", [x + [pad] * (width - len(x)) for x in new], (len(new), width))
        upload.add("enc_rows", rows, (len(rows), 3))
        # one entry per new position: (row, index in the chunk, slot, cache position)
        upload.add("enc_new", [[r, i, s.slot, s.n_encoded + i] for r, (s, x) in enumerate(zip(todo, new))
                               for i in range(len(x))], (sum(map(len, new)), 4))
        return todo, None

    def _encode(self, todo: list[StreamState], sent: dict[str, torch.Tensor],
                shape: tuple[int, int, int] | None = None) -> None:
        tokens = sent["enc_tokens"]
        if shape is not None:   # padded to a captured shape (_plan_encode)
            self.graphs.run_encoder(tokens, sent["enc_rows"], shape[2])
            for s in todo:
                s.n_encoded = s.available
            return
        slots, start, n_new = sent["enc_rows"].unbind(1)
        bi, ii, wslots, pos = sent["enc_new"].unbind(1)
        if self.cfg.causal_encoder:
            lone = todo[0].slot if len(todo) == 1 else None
            length = max(s.n_encoded for s in todo)
            room = self._room(lone, length, tokens.shape[1])   # (as the decoder's self caches: _decode_core)
            # (at least one earlier position, as without room: the same layout, hence the same sums)
            caches = self.pool.gather_kv("enc", slots, max(length, 1) + room * tokens.shape[1], lone)
            enc, new_kv = self.net.encode_chunk(tokens, start, caches, room=room)
        else:  # bidirectional: the whole sentence at once, after it ended
            enc, new_kv = self.net.encode(tokens, n_new), None
        self._store_encoded(enc, new_kv, wslots, pos, lambda values: values[bi, :, :, ii])
        for s in todo:
            s.n_encoded = s.available

    def _encode_core(self, tokens: torch.Tensor, rows: torch.Tensor, length: int) -> None:
        """The device half of a causal encoder's chunk step at a fixed shape (what a CUDA graph captures):
        tokens (B, W) padded, rows (B, 3) = (slot, positions encoded before, new positions); caches gathered
        at `length` positions. Every (row, position) of the padded block is written: a real new position to its
        slot, padding (past a row's new positions, or a row of the scratch slot) to the scratch slot, which no
        stream reads."""
        slots, start, n_new = rows.unbind(1)
        w = tokens.shape[1]
        room = self._room(None, length, w)
        i = torch.arange(w, device=tokens.device).view(1, -1)
        pos = (start.view(-1, 1) + i).clamp_max(self.cfg.max_positions - 1)   # (B, W): the model's and the store's
        enc, new_kv = self.encode_chunk_fn(tokens, start, self.pool.gather_kv("enc", slots, max(length, 1) + room * w),
                                           room=room, positions=pos)
        wslots = torch.where(i < n_new.view(-1, 1), slots.view(-1, 1), self.scratch)   # (B, W)
        # the whole block goes to (wslots, pos): a view of it, no gather of its entries (three kernels and a copy
        # a kind fewer in the graph)
        self._store_encoded(enc, new_kv, wslots, pos, lambda values: values.permute(0, 3, 1, 2, 4))

    def _store_encoded(self, enc: torch.Tensor, new_kv: list | None, slots: torch.Tensor, positions: torch.Tensor,
                       pick) -> None:
        """Store what the encoder made of new source positions: its own keys and values (a causal encoder's
        `new_kv`, per layer (B, H, N, dk)), every decoder layer's cross keys and values of `enc` (B, N, d), and
        calibration's mask keys. pick(values (B, layers, H, N, dk)) gives the entries to store, (..., layers, H,
        dk) with `slots` and `positions` of shape (...): where each goes. Every layer in one write per kind
        (per layer it took ~30 more operators a step)."""
        def write(prefix: str, keys: torch.Tensor, values: torch.Tensor) -> None:   # each (B, layers, H, N, dk)
            self.pool.write_layers(prefix + "_k", slots, positions, pick(keys))
            self.pool.write_layers(prefix + "_v", slots, positions, pick(values))
        if new_kv is not None:
            write("enc", *(torch.stack([kv[j] for kv in new_kv], 1) for j in (0, 1)))
        write("cross", *self.net.cross_kv_layers(enc))
        mks = self.net.mask_keys(enc)
        if mks:
            self.pool.write_layers("cross_mk", slots, positions, pick(torch.stack(mks, 1)))

    def stutter_context(self, state: StreamState) -> StutterContext | None:
        """What the no-stutter rule sees of this stream besides its target: the source read so far."""
        if not self.needs_source:
            return None
        return StutterContext(self.tok, state.source_tokens, state.source_words)

    def bans(self, state: StreamState) -> list[int]:
        """Every token the filters forbid this stream's next WRITE."""
        if not self.banning:
            return []
        return filter_bans(self.banning, state.target_tokens, self.stutter_context(state))

    def _plan_decode(self, states: list[StreamState], upload: Upload, record: bool) -> tuple[int, int]:
        """The batch's slots, and the slot rows the host changed since the device last saw them (new
        streams, words read, the source ended, tokens written on the host): only those are uploaded."""
        slots = [s.slot for s in states]
        width = len(slots)
        if self.scratch is not None:  # pad to the batch bucket with the scratch slot (never advances)
            width = 1
            while width < len(slots):
                width *= 2
        # a captured step writes the changed rows itself, so that no eager operator runs between the graphs; its
        # inputs go in place (Upload.place), one row per batch row each (padding: the scratch slot's own values)
        graphed = self.graphs is not None and not record   # (a recorded stream, a diagnostic, runs eagerly)
        at = None
        if graphed:
            at = self.graphs.decoder_places(width)   # (a batch size not captured: the clear error, before any change)
            upload.place("dec_slots", at[0], slots, (width,), self.scratch)
        else:
            upload.add("dec_slots", slots + [self.scratch] * (width - len(slots)), (width,))
        fresh, changes, bos = [], [], self.cfg.bos_id
        t_max, a_max = 1, 0   # the longest target and source of the batch
        for s in states:   # (one pass: it runs for every row of every step)
            target, available = s.target_tokens, len(s.source_tokens) + s.source_finished   # (= s.available)
            if len(target) > t_max:
                t_max = len(target)
            if available > a_max:
                a_max = available
            if s.fresh:   # a new stream: its slot's policy values (float64 bit patterns: the upload is int64)
                values = s.policy.slot_values()   # (one policy class per model: the same names for every stream)
                fresh.append([s.slot] + [_bits(values[n]) for n in self.slot_names])
                s.fresh = False
            if s.dirty:
                changes.append([s.slot, len(target), target[-1] if target else bos, available,
                                int(s.source_finished)])
                s.dirty = False
        if graphed:
            upload.place("fresh", at[2], fresh, (width, 1 + len(self.slot_names)), self._scratch_fresh)
            upload.place("changes", at[1], changes, (width, 5), self._scratch_change)
        else:
            if fresh:
                upload.add("fresh", fresh, (len(fresh), 1 + len(self.slot_names)))
            if changes:
                upload.add("changes", changes, (len(changes), 5))
        if self.banning:
            # (row, token) pairs a WRITE may not choose: they would repeat or stutter the row's target
            bans = [[r, tok] for r, s in enumerate(states) for tok in self.bans(s)]
            upload.add("bans", bans, (len(bans), 2))
        # the cache lengths the decoder gathers
        return self.bucket(t_max), self.bucket(a_max)

    def _launch_decode(self, states: list[StreamState], sent: dict[str, torch.Tensor], t_max: int,
                       a_max: int, record: bool) -> tuple[torch.Tensor, DecodeOutput | None]:
        """One batched decoder trial, queued on the device. The per-stream numbers the model alone uses (k, δ,
        GMA's sums, a variant's context) stay in the pool's slot rows; what the host reads back (`collect`) is
        one (B, 3) tensor: READ or not, the source it needs, the token (rows past the batch: padding)."""
        slots = sent["dec_slots"]
        if self.graphs is not None and not record:   # (else _plan_decode placed its inputs)
            return self.graphs.run(slots, t_max, a_max, sent["changes"], sent["fresh"]), None
        if "fresh" in sent:
            self.pool.rows.reset_rows(sent["fresh"], self.slot_names)
        if "changes" in sent:
            self.pool.rows.write_rows(sent["changes"])
        lone = states[0].slot if len(states) == 1 else None
        decided, out = self._decode_core(slots, t_max, a_max, sent.get("bans"), lone, record)
        return decided, out if record else None

    def _read_back(self, pending: PendingStep) -> list[list[int]]:
        """The launched decoder trial's (B, 3) decisions on the host (on a GPU: once its kernels are done); B may
        count padding rows past the batch."""
        if pending.readback is None:
            return pending.decided.tolist()
        self._wait(pending.readback[1].synchronize)   # (its event: recorded behind the copy)
        decided = pending.decided.tolist()
        self.readback.give(pending.readback)   # (read: the buffer may take the next step's decisions)
        pending.readback = None
        return decided

    def _wait(self, wait) -> None:
        """`wait()`, which blocks until the device has done something; its time on a benchmark's wait clock
        (`wait_seconds`) when one is kept."""
        if self.wait_seconds is None:
            wait()
            return
        t0 = time.perf_counter()
        wait()
        self.wait_seconds += time.perf_counter() - t0

    def synchronize(self) -> None:
        """Wait until the device has run everything queued (CUDA; elsewhere the work is done already), on the wait
        clock as the read back's waits are (a benchmark's clock that stops only once the device is done)."""
        if self.device.type == "cuda":
            self._wait(functools.partial(torch.cuda.synchronize, self.device))

    def _results(self, states: list[StreamState], decided: list[list[int]], out: DecodeOutput | None,
                 index: list[int], outputs: list) -> None:
        """Each stream's decoder decision applied on the host: words read, or a token written (the device has
        moved its row on already); what states[r] did goes to outputs[index[r]]. (zip: `decided`'s padding rows
        past the batch are left out.)"""
        for r, (s, (was_read, n, token)) in enumerate(zip(states, decided)):
            if was_read:
                s.need = n
                outputs[index[r]] = self._read(s, n)
                continue
            if s.record is not None:
                s.record.append({"n": out.n[r].tolist(),
                                 "p": out.p[r].tolist() if out.p is not None else None,
                                 "attention": [a[r].mean(0)[: s.available].tolist() for a in out.attention]})
            outputs[index[r]] = self._write(s, token, on_device=True)

    def _decode_core(self, slots: torch.Tensor, t_max: int, a_max: int, bans: torch.Tensor | None = None,
                     lone: int | None = None, record: bool = False):
        """The device half of a decoder trial for the rows `slots` (padding rows: the scratch slot): gather,
        decode, choose, write the new keys and move the writing rows on. Returns the (B, 3) decisions (READ?,
        source needed, token) and the step's DecodeOutput. Sync-free unless the form keeps host shortcuts;
        with `lone` None and no bans it is what a CUDA graph captures (models/cuda_graphs.py)."""
        pool, rows = self.pool, self.pool.rows
        t, prev, avail, finished = rows.gather_host(slots)
        k, delta, running, contexts = (None if x is None else x.index_select(0, slots)
                                       for x in (rows.k, rows.delta, rows.running, rows.context))
        mask_caches = pool.gather("cross_mk", slots, a_max, lone) if pool.layers["cross_mk"] else None
        room = self._room(lone, t_max, 1)
        inp = DecodeInput(prev, t, pool.gather_kv("dec", slots, t_max + room, lone),
                          pool.gather_kv("cross", slots, a_max, lone), avail, finished, k, delta, running,
                          mask_caches=mask_caches, contexts=contexts, self_room=room)
        out = (self.net.decode_step if record else self.decode_fn)(inp, need_weights=record,
                                                                   early_exit=not self.sync_free)
        decided, moved = (self._settle if record else self.settle_fn)(out, slots, t, prev, avail, finished, running,
                                                                       contexts, bans)
        # every row writes its decoder keys at t: a READ does not advance t, so its keys are rewritten
        # by the step that finally WRITEs there before any step reads position t (no mask, no sync)
        pool.write_layers("dec_k", slots, t, moved["dec_k"])
        pool.write_layers("dec_v", slots, t, moved["dec_v"])
        # a WRITE moves the row on, on the device: position, last token, GMA's sums, a carried context
        rows.t.index_copy_(0, slots, moved["t"])
        rows.prev.index_copy_(0, slots, moved["prev"])
        if "running" in moved:
            rows.running.index_copy_(0, slots, moved["running"])
        if "context" in moved:
            rows.context.index_copy_(0, slots, moved["context"])
        return decided, out

    def _settle(self, out: DecodeOutput, slots: torch.Tensor, t: torch.Tensor, prev: torch.Tensor,
                avail: torch.Tensor, finished: torch.Tensor, running: torch.Tensor | None,
                contexts: torch.Tensor | None, bans: torch.Tensor | None) -> tuple[torch.Tensor, dict]:
        """What a decoder trial decided, from its DecodeOutput: the (B, 3) decisions (READ?, source needed, token)
        and the rows' values moved on where they WRITE (t, prev, GMA's sums, a carried context) with the new keys
        stacked for the pool, by name. Computes and writes nothing else: graphs-fused compiles it (settle_fn)."""
        cfg = self.cfg
        hidden, new_kv, read, need = out.hidden, out.new_kv, out.read, out.need
        if out.exited_early:  # every row READ below the top layer (host shortcut, see decode_step)
            tokens = torch.zeros_like(need)
        elif self.sync_free:  # scores for every row: a mask of the writing rows would synchronise
            tokens = self._choose(hidden, None, finished, bans)
        else:                 # on the host the mask is free and saves the READ rows' output projection
            tokens = torch.zeros_like(need)
            keep = ~read
            if keep.any():
                tokens[keep] = self._choose(hidden[keep], keep, finished[keep], bans)
        # EOS before the source has ended is a READ (the reference agents' rule): a translation
        # ends with its sentence, not while the speaker is still talking
        # (on bools a > b is a & ~b: one kernel where it took two)
        early = (tokens == cfg.eos_id) > (read | finished)
        need = torch.where(early, avail + 1, need)
        read = read | early
        if self.scratch is not None:   # padding rows (the scratch slot) never advance
            wrote = (slots != self.scratch) > read
        else:
            wrote = ~read
        moved = {"dec_k": torch.stack([kv[0][:, :, 0] for kv in new_kv], 1),
                 "dec_v": torch.stack([kv[1][:, :, 0] for kv in new_kv], 1),
                 "t": t + wrote, "prev": torch.where(wrote, tokens, prev)}
        if out.running is not None:
            moved["running"] = torch.where(wrote.view(-1, 1), out.running, running)
        if out.context is not None:
            moved["context"] = torch.where(wrote.view(-1, 1, 1), out.context.to(contexts.dtype), contexts)
        return torch.stack([read.long(), need, tokens], 1), moved

    def _graph_step(self, slots: torch.Tensor, changes: torch.Tensor, fresh: torch.Tensor, length: int) -> torch.Tensor:
        """What a decoder graph captures: the slot rows the host changed (`changes` (B, 5), `fresh` (B, 1 + names),
        one row per batch row, padding rows the scratch slot's own values) written, then the step at `length`
        cache positions; the (B, 3) decisions."""
        self.pool.rows.reset_rows(fresh, self.slot_names)
        self.pool.rows.write_rows(changes)
        return self._decode_core(slots, length, length)[0]

    def _room(self, lone: int | None, length: int, new: int) -> bool:
        """Whether a gather of `length` positions leaves room for the `new` keys the model makes next (written
        into the copy instead of concatenated to it: DecodeInput.self_room). Not for a lone stream, whose
        caches are views of the pool that the model must not write, nor past the pool's positions."""
        return lone is None and max(length, 1) + new <= self.cfg.max_positions

    def _choose(self, hidden: torch.Tensor, keep: torch.Tensor | None, finished: torch.Tensor,
                bans: torch.Tensor | None) -> torch.Tensor:
        """The token each row of `hidden` writes if it WRITEs: the best one the decoding options
        allow. keep: which batch rows `hidden` holds (None: all of them, in order)."""
        logits = self.scores(hidden)
        for f in self.filters:                  # rules that edit every row's logits (NoEarlyEos)
            f.mask(logits, finished)
        if bans is not None and len(bans):      # the banning rules' per-row tokens, planned on the host
            rows, toks = bans.unbind(1)
            if keep is not None:   # batch rows -> rows of `hidden` (bans of READ rows are dropped)
                kept = keep[rows]
                rows, toks = (torch.cumsum(keep, 0) - 1)[rows[kept]], toks[kept]
            # (a tensor value, not a Python float: no host-made tensor beyond the step's one upload)
            logits.index_put_((rows, toks), logits.new_full((), float("-inf")))
        return logits.argmax(-1)

    def _write(self, s: StreamState, token: int, on_device: bool = False) -> StepOutput:
        """Commit one target token; release the words it completes. on_device: the decoder step wrote it
        and moved the slot's row on already (else the row is uploaded before the stream's next trial).
        (Every row of a flat-out step that writes comes here, on the thread that steps: kept lean.)"""
        if not on_device:
            s.dirty = True
        available = len(s.source_tokens) + s.source_finished   # (= s.available)
        s.target_tokens.append(token)
        s.token_delays.append(available)
        released = ()
        eos = token == self.cfg.eos_id
        pending = s.pending
        if pending and (eos or self.tok.word_start[token]):
            # (its <unk>s copy the source's characters outside the vocabulary)
            text = self.tok.word_text(pending, s.source_unknown, s.unknown_used)
            s.pending = pending = []
            if text:  # a lone "▁" piece makes no word
                word = TargetWord(text, len(s.source_words), available)
                s.words.append(word)
                released = (word,)
        if eos:
            s.done = True
            return StepOutput(WRITE, token, released, True)
        pending.append(token)
        return StepOutput(WRITE, token, released, s.done)
