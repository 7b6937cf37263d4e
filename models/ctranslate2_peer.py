"""A simulserve checkpoint as a CTranslate2 model: an outside reference for the model code and its speed.

CTranslate2 (the `[peer]` extra) is a C++ inference engine for Transformers. Our offline model is a
plain post-norm Transformer, so it maps onto CTranslate2's TransformerSpec weight for weight:

    ours                                     CTranslate2 spec
    embed (one matrix, tied)                 encoder.embeddings[0], decoder.embeddings, decoder.projection
                                             (identical arrays: CTranslate2 stores them once, as aliases)
    × √d_model, then + sinusoidal_table      scale_embeddings=True, position_encodings.encodings = our table
                                             (ours puts sin and cos in halves with its own frequencies, so
                                             the table travels explicitly instead of CTranslate2's built-in)
    self_attn q/k/v                          self_attention.linear[0] = [q; k; v] fused, linear[1] = out
    cross_attn q, k/v                        attention.linear[0] = q, linear[1] = [k; v] fused, linear[2] = out
    q · head_dim^-0.5                        CTranslate2's default query scaling (the same product)
    ln1/ln2(/ln3) after each residual        pre_norm=False: each sublayer's layer_norm after its residual
    LayerNorm eps                            config.layer_norm_epsilon (torch's 1e-5, read from the model)
    source + EOS, decoder starts at BOS      add_source_eos=True, decoder_start_token=<s>

Which checkpoints map (`unmappable_reason`): only attention="standard" with a bidirectional encoder
and no cross-attention variant — the shipped `offline` model. CTranslate2's encoder self-attention
always sees the whole (unpadded) source: a causal encoder (position i attends to 0..i only; every
wait-k and GMA model has one, config.validate requires it) has no switch there. Its cross-attention
always sees the whole source too: wait-k's per-step prefix window (target step t sees t + k
positions, also once the source is complete) and GMA's window with its added log Gaussian prior and
its per-layer step predictor have no equivalent, nor do the variants' reweighted or convolved
attentions (models/variants/). Converting those anyway would translate with a different model.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from models.config import ModelConfig
from models.errors import UserError
from models.policies import policy_class

# what the project measures CTranslate2 at; `ctranslate2.get_supported_compute_types("cpu")` lists more
COMPUTE_TYPES = ("float32", "int8")


class PeerError(UserError):
    """The checkpoint has no CTranslate2 equivalent, or the `[peer]` extra is missing."""


def import_ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise PeerError("CTranslate2 is not installed: pip install -e '.[peer]'") from None
    return ctranslate2


def unmappable_reason(cfg: ModelConfig) -> str | None:
    """Why a model with this config cannot become a CTranslate2 model (None: it can); every reason."""
    why = []
    if cfg.causal_encoder:
        why.append("its encoder is causal (position i sees source positions 0..i only, so that received "
                   "states never change while streaming); CTranslate2's encoder self-attention always sees "
                   "the whole source")
    note = policy_class(cfg).window_note
    if note:
        why.append(f"{note}; CTranslate2's cross-attention always sees the whole source, with no prior")
    if cfg.variant.kind != "none":
        why.append(f"the {cfg.variant.kind} cross-attention variant has no CTranslate2 equivalent")
    return "; and ".join(why) or None


def _array(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).contiguous().numpy()


def _linear(spec, *linears) -> None:
    """One CTranslate2 linear from one or more of ours, stacked output rows first to last (fusion)."""
    spec.weight = np.concatenate([_array(lin.weight) for lin in linears], 0)
    spec.bias = np.concatenate([_array(lin.bias) for lin in linears], 0)


def _norm(spec, ln) -> None:
    spec.gamma = _array(ln.weight)
    spec.beta = _array(ln.bias)


def _ffn(spec, ffn, ln) -> None:
    _norm(spec.layer_norm, ln)
    _linear(spec.linear_0, ffn.fc1)
    _linear(spec.linear_1, ffn.fc2)


def _self_attention(spec, attn, ln) -> None:
    _linear(spec.linear[0], attn.q_proj, attn.k_proj, attn.v_proj)
    _linear(spec.linear[1], attn.out_proj)
    _norm(spec.layer_norm, ln)


def build_spec(model, tokenizer):
    """The CTranslate2 TransformerSpec holding `model`'s weights (float32; quantised when loaded)."""
    ct2 = import_ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec
    cfg = model.cfg
    why = unmappable_reason(cfg)
    if why:
        raise PeerError(f"this {cfg.policy} model cannot be converted to CTranslate2: {why}")
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.encoder_layers, cfg.decoder_layers), cfg.n_heads, pre_norm=False,
        activation=common_spec.Activation.RELU)
    embed, table = _array(model.embed.weight), _array(model.positions)
    for side in (spec.encoder, spec.decoder):
        emb = side.embeddings[0] if isinstance(side.embeddings, list) else side.embeddings
        emb.weight = embed
        side.scale_embeddings = True          # × √d_model, as Transformer.embed_tokens
        side.position_encodings.encodings = table
    spec.decoder.projection.weight = embed    # tied output projection, no bias
    for layer_spec, layer in zip(spec.encoder.layer, model.encoder):
        _self_attention(layer_spec.self_attention, layer.self_attn, layer.ln1)
        _ffn(layer_spec.ffn, layer.ffn, layer.ln2)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder):
        _self_attention(layer_spec.self_attention, layer.self_attn, layer.ln1)
        cross = layer_spec.attention
        _linear(cross.linear[0], layer.cross_attn.q_proj)
        _linear(cross.linear[1], layer.cross_attn.k_proj, layer.cross_attn.v_proj)
        _linear(cross.linear[2], layer.cross_attn.out_proj)
        _norm(cross.layer_norm, layer.ln2)
        _ffn(layer_spec.ffn, layer.ffn, layer.ln3)
    pieces = [tokenizer.sp.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    conf = spec.config
    conf.unk_token, conf.bos_token, conf.eos_token = (pieces[cfg.unk_id], pieces[cfg.bos_id], pieces[cfg.eos_id])
    conf.decoder_start_token = pieces[cfg.bos_id]
    conf.add_source_bos, conf.add_source_eos = False, True   # our source is its subwords + EOS
    conf.layer_norm_epsilon = float(model.encoder[0].ln1.eps)
    del ct2
    return spec


def convert(checkpoint, output_dir: str | Path, quantization: str | None = None, force: bool = False) -> Path:
    """Write the CTranslate2 model directory of a simulserve checkpoint (directory or shipped name).
    quantization: None keeps float32 (CTranslate2 can still load it as int8: compute_type="int8")."""
    ct2 = import_ctranslate2()
    from models.checkpoint import load_checkpoint
    from models.shipped import resolve_checkpoint
    model, tok, _ = load_checkpoint(resolve_checkpoint(str(checkpoint)))
    spec = build_spec(model, tok)

    class _FromSpec(ct2.converters.Converter):
        def _load(self):
            return spec

    out = Path(output_dir)
    if out.exists() and not force:
        raise PeerError(f"{out} already exists: pass --force to replace it")
    _FromSpec().convert(str(out), quantization=quantization, force=True)
    return out


class CTranslate2Peer:
    """The converted model in CTranslate2, translating subword ids greedily like the project's
    offline whole-sentence decoding (same length cap: models/step.py's MAX_LEN_A/B)."""

    def __init__(self, model_dir: str | Path, tokenizer, cfg: ModelConfig, compute_type: str = "float32",
                 threads: int = 1):
        ct2 = import_ctranslate2()
        self.tok, self.cfg = tokenizer, cfg
        self.translator = ct2.Translator(str(model_dir), device="cpu", compute_type=compute_type,
                                         intra_threads=threads, inter_threads=1)

    def cap(self, n_source: int) -> int:
        """Target tokens before the project's decoder writes EOS by force (StreamingDecoder._max_target_len)."""
        from models.step import MAX_LEN_A, MAX_LEN_B
        return min(self.cfg.max_positions - 1, MAX_LEN_A * (n_source + 1) + MAX_LEN_B)

    def translate_ids(self, sources: list[list[int]]) -> list[list[int]]:
        """One batch of source subword ids (no EOS) -> target ids (no EOS), greedy."""
        sp = self.tok.sp
        caps = [self.cap(len(s)) for s in sources]
        results = self.translator.translate_batch(
            [[sp.id_to_piece(i) for i in s] for s in sources], beam_size=1, max_batch_size=0,
            max_decoding_length=max(caps), min_decoding_length=0,   # ours may end at once (default: 1)
            max_input_length=0, return_scores=False)
        # greedy is prefix-stable: the batch's one length limit, then each sentence's own cap
        return [[sp.piece_to_id(x) for x in r.hypotheses[0][:c]] for r, c in zip(results, caps)]

    def translate(self, sentences: list[str], batch_size: int) -> tuple[list[list[int]], list[str]]:
        """Whole sentences -> (target ids without EOS, detokenised text), `batch_size` at a time."""
        ids, texts = [], []
        for start in range(0, len(sentences), batch_size):
            words = [s.split() for s in sentences[start:start + batch_size]]
            out = self.translate_ids([[i for w in ws for i in self.tok.encode_word(w)] for ws in words])
            ids.extend(out)
            # (as our loop writes them: an <unk> copies the source's unknown characters)
            texts.extend(self.tok.decode_copying(x, ws) for x, ws in zip(out, words))
        return ids, texts


def register(sub) -> None:
    p = sub.add_parser(
        "convert-ctranslate2", help="write a checkpoint as a CTranslate2 model directory (offline models)",
        description="Convert a simulserve checkpoint into a CTranslate2 model directory (needs the [peer] "
                    "extra). Only models with a bidirectional encoder and standard cross-attention map "
                    "(the shipped `offline`); wait-k and GMA models are refused with the reason.",
        epilog="examples:\n"
               "  simulserve convert-ctranslate2 -m offline -o offline-ct2\n"
               "  simulserve convert-ctranslate2 -m offline -o offline-ct2-int8 --quantization int8 --force",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", "-m", default="offline", help="checkpoint dir or shipped name (default offline)")
    p.add_argument("--output", "-o", required=True, help="CTranslate2 model directory to write")
    p.add_argument("--quantization", choices=COMPUTE_TYPES, default=None,
                   help="store the weights quantised (default float32; a float32 directory also loads as int8)")
    p.add_argument("--force", action="store_true", help="replace an existing output directory")
    p.set_defaults(func=run)


def run(args) -> int:
    out = convert(args.checkpoint, args.output, args.quantization, args.force)
    print(f"wrote {out} (load it with ctranslate2.Translator({str(out)!r}))")
    return 0
