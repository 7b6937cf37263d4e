"""Checkpoint directories: weights (safetensors), config.json and the SentencePiece model.

    ckpt/
      config.json      {"format": "simulserve-checkpoint", "version": 1, "model": {...}, "training": {...}}
      model.safetensors
      spm.model

Loading never unpickles anything; every way a checkpoint can be malformed
(missing file, bad JSON, unknown fields, vocabulary or tensor shape mismatch)
raises CheckpointError naming the problem.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from models.config import ConfigError, ModelConfig
from models.errors import UserError
from models.tokenizer import Tokenizer
from models.transformer import Transformer

FORMAT = "simulserve-checkpoint"
VERSION = 1


class CheckpointError(UserError):
    pass


def save_checkpoint(directory: str | Path, model: Transformer, tokenizer: Tokenizer,
                    training: dict | None = None, dtype: torch.dtype | None = torch.float16) -> Path:
    """Write a checkpoint; weights are stored in `dtype` (fp16 keeps shipped models small)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    state = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).contiguous().cpu()
             for k, v in model.state_dict().items()}
    tmp = d / "model.safetensors.tmp"
    save_file(state, str(tmp))
    tmp.replace(d / "model.safetensors")
    (d / "spm.model").write_bytes(tokenizer.proto)
    meta = {"format": FORMAT, "version": VERSION, "model": model.cfg.to_dict(), "training": training or {}}
    (d / "config.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    return d


def read_config(directory: str | Path) -> tuple[ModelConfig, dict]:
    d = Path(directory)
    if not d.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {d}")
    path = d / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{path} is missing")
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a simulserve checkpoint config (format != {FORMAT!r})")
    if meta.get("version") != VERSION:
        raise CheckpointError(f"{path}: unsupported checkpoint version {meta.get('version')!r}")
    try:
        cfg = ModelConfig.from_dict(meta.get("model"))
    except ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from None
    return cfg, meta.get("training") or {}


def load_checkpoint(directory: str | Path, device: str | torch.device = "cpu",
                    dtype: torch.dtype = torch.float32) -> tuple[Transformer, Tokenizer, dict]:
    """Load (model in eval mode, tokenizer, training info)."""
    d = Path(directory)
    cfg, training = read_config(d)
    spm_path = d / "spm.model"
    if not spm_path.is_file():
        raise CheckpointError(f"{spm_path} is missing")
    try:
        tok = Tokenizer(spm_path)
    except (RuntimeError, OSError) as e:
        raise CheckpointError(f"{spm_path} is not a SentencePiece model: {e}") from None
    if tok.vocab_size != cfg.vocab_size:
        raise CheckpointError(f"vocabulary mismatch: spm.model has {tok.vocab_size} pieces, "
                              f"config.json says vocab_size={cfg.vocab_size}")
    ids = tok.special_ids
    want = {k: getattr(cfg, k) for k in ids}
    if ids != want:
        raise CheckpointError(f"special token ids of spm.model {ids} differ from config.json {want}")
    weights = d / "model.safetensors"
    if not weights.is_file():
        raise CheckpointError(f"{weights} is missing")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{weights} is not a valid safetensors file: {e}") from None
    model = Transformer(cfg)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{weights} does not match config.json: missing tensors {missing[:5]}, "
                              f"unexpected tensors {unexpected[:5]}")
    for name, t in state.items():
        if t.shape != expected[name].shape:
            raise CheckpointError(f"{weights}: tensor {name} has shape {tuple(t.shape)}, "
                                  f"config.json implies {tuple(expected[name].shape)}")
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise CheckpointError(f"{weights}: tensor {name} contains NaN or infinite values")
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()})
    return model.to(device=device, dtype=dtype).eval(), tok, training


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_dtype(requested: str | None, device: torch.device) -> torch.dtype:
    """Inference dtype: float32 (default, what the results were measured with); bfloat16 halves
    the weights every step reads (faster where the CPU has AVX512-BF16/AMX, and on GPUs); float16
    on CUDA only (CPU kernels for it are slow or missing). Lower precision can change outputs."""
    name = requested or "float32"
    if name not in DTYPES:
        raise CheckpointError(f"unknown dtype {name!r}: use one of {', '.join(DTYPES)}")
    if name == "float16" and torch.device(device).type != "cuda":
        raise CheckpointError("float16 inference needs a CUDA device; on CPU use bfloat16 or float32")
    return DTYPES[name]


def pick_device(requested: str | None = None) -> torch.device:
    """`auto` (default) picks CUDA when present, else CPU; a bad name or a missing device is a
    CheckpointError (a message for the user, not a traceback)."""
    if requested in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(requested)
    except (RuntimeError, TypeError):
        raise CheckpointError(f"unknown device {requested!r}: use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise CheckpointError("CUDA was requested but no CUDA device is available")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise CheckpointError(f"no device {requested}: this machine has {torch.cuda.device_count()} CUDA "
                              "device(s), cuda:0 first")
    return dev
