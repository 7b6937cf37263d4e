"""Training loop: label-smoothed cross entropy, Adam + inverse-sqrt warm-up, batches by
token count, validation per epoch, resumable state, checkpoint averaging, DDP.

Everything the loop saves is safetensors + JSON (no pickles):
    OUTPUT/train_state/   model/optimizer/rng tensors + state.json (step, epoch, position)
    OUTPUT/epochs/        fp32 weights at the end of each epoch (for averaging)
    OUTPUT/checkpoint/    the deployable checkpoint: average of the last N epochs, fp16
    OUTPUT/log.jsonl      one line per epoch (losses, steps, minutes)
"""
from __future__ import annotations

import fnmatch
import json
import math
import os
import random
import signal
import sys
import threading
import time
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from models.checkpoint import pick_device, save_checkpoint
from models.config import ModelConfig
from models.training.data_loading import collate, encode_pairs, make_batches, oversampled, read_parallel
from models.training.unlikelihood import unlikelihood_loss
from models.errors import UserError
from models.policies import policy_class
from models.tokenizer import Tokenizer, vocabulary_difference
from models.transformer import Transformer


@dataclass
class TrainConfig:
    output: str
    model: dict
    data: str | None = None          # directory with train/valid.{src,tgt} and spm.model
    src_lang: str = "de"
    tgt_lang: str = "en"
    max_tokens: int = 4096
    lr: float = 5e-4
    warmup: int = 4000
    betas: tuple = (0.9, 0.98)
    label_smoothing: float = 0.1
    max_epochs: int = 100
    max_steps: int | None = None
    max_minutes: float | None = None  # stop (and save) after this much time in this run
    save_every_minutes: float = 10.0
    average_last: int = 5
    snapshot_every: int | None = None  # also keep OUTPUT/snapshots/stepNNNNNN every N updates (learning curves)
    seed: int = 1
    init_from: str | None = None      # fine-tune from this checkpoint directory
    oversample: dict = field(default_factory=dict)  # {source: n}: train.SOURCE n times in all
    # GMA δ curriculum [δ_start, N]: train with a wider window first, δ_start -> the model's default_delta
    # linearly over this run's first N updates (issue 13); None: the model's δ throughout
    delta_curriculum: list | None = None
    # GMA: each training sentence's δ drawn from this list (repeat a value to weight it), so one model
    # stays good at every δ the server offers; None: the model's δ (or the curriculum's) throughout
    delta_sample: list | None = None
    # weight of the unlikelihood term on repeats (models/training/unlikelihood.py; 0: off), the longest
    # run of subwords it counts as a stutter, and the n-gram it counts as a repeat anywhere (0: none)
    unlikelihood: float = 0.0
    unlikelihood_stutter: int = 12
    unlikelihood_ngram: int = 0
    # word-level distillation: a frozen checkpoint (same vocabulary) whose next-token distribution the
    # model learns, weight `teacher_weight` against the reference's cross-entropy (1: the teacher alone).
    # The teacher may be the starting weights: then only the other terms (unlikelihood) move the model,
    # and the distillation keeps it where it was elsewhere
    teacher: str | None = None
    teacher_weight: float = 1.0
    # train only the parameters whose names match one of these patterns (fnmatch, "decoder.2.ffn.*"), the
    # rest frozen; None: all of them
    train_only: list | None = None
    threads: int | None = None
    device: str = "auto"
    extra: dict = field(default_factory=dict)


def trains_on_gpu(device: str | None, cuda_available: bool) -> bool:
    """Whether a run asked to train on `device` (auto, cpu, cuda, cuda:N) will run on a GPU."""
    device = device or "auto"
    return device.startswith("cuda") or (device == "auto" and cuda_available)


def _read_recipe(path: Path, seen: tuple = ()) -> dict:
    """The recipe at `path` with its `base:` chain applied: a mapping (model, oversample, gpu) is
    amended key by key, any other value replaces the base's, so a follow-up run's recipe states only
    what differs."""
    import yaml
    if path.resolve() in seen:
        raise UserError(f"{path}: `base:` chain loops back to itself")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:   # (its message names the line and column)
        raise UserError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: a training config must be a mapping")
    base = raw.pop("base", None)
    if base is None:
        return raw
    merged = _read_recipe(path.parent / base, seen + (path.resolve(),))
    for key, value in raw.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def load_train_config(path: str | Path, overrides: dict | None = None,
                      cuda_available: bool | None = None) -> TrainConfig:
    """A recipe's settings. `base: OTHER.yaml` (relative to the recipe) starts from another recipe,
    which this one amends (see `_read_recipe`). Its optional `gpu:` mapping overrides them when the run
    trains on a GPU (larger batches, another schedule: training uses what is at hand); `overrides`
    (the command line) win over both."""
    raw = _read_recipe(Path(path))
    gpu = raw.pop("gpu", None) or {}
    if not isinstance(gpu, dict):
        raise UserError(f"{path}: `gpu:` must be a mapping of settings used on a GPU")
    overrides = overrides or {}
    known = TrainConfig.__dataclass_fields__
    unknown = sorted((set(raw) | set(gpu)) - set(known))
    if unknown:
        raise UserError(f"{path}: unknown training config keys {unknown}")
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if trains_on_gpu(overrides.get("device", raw.get("device")), cuda_available):
        raw.update(gpu)
    raw.update(overrides)
    missing = [f.name for f in fields(TrainConfig) if f.default is MISSING and f.default_factory is MISSING
               and f.name not in raw]
    if missing:
        raise UserError(f"{path}: missing training config keys {missing}")
    for f in fields(TrainConfig):
        if f.name in raw and not _of_type(raw[f.name], f.type):
            raise UserError(f"{path}: {f.name} must be {f.type.replace(' | None', ' or null')}, "
                            f"got {raw[f.name]!r}")
    return TrainConfig(**raw)


# a recipe's YAML values against TrainConfig's annotations (bool is no number: `lr: yes` is a typo)
_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "dict": (dict,), "list": (list, tuple),
          "tuple": (list, tuple), "bool": (bool,)}


def _of_type(value, annotation: str) -> bool:
    kinds = [k.strip() for k in annotation.split("|")]
    if value is None:
        return "None" in kinds
    allowed = [_TYPES[k] for k in kinds if k in _TYPES]
    if len(allowed) < len([k for k in kinds if k != "None"]):
        return True   # (an annotation this check does not know: left to the code that reads it)
    if isinstance(value, bool) and "bool" not in kinds:
        return False
    return any(isinstance(value, t) for t in allowed)


LOG_EVERY = 20  # updates per line of OUTPUT/updates.jsonl


def inverse_sqrt_lr(step: int, lr: float, warmup: int) -> float:
    step = max(step, 1)
    return lr * min(step / warmup, math.sqrt(warmup / step))


def curriculum_delta(step: int, curriculum: list | None, final: float) -> float:
    """GMA's training δ at this run's update `step` (0-based): δ_start -> `final` linearly over N updates."""
    if not curriculum:
        return float(final)
    start, n = float(curriculum[0]), int(curriculum[1])
    return float(final) if step >= n else start + (float(final) - start) * step / n


def check_delta_curriculum(curriculum, attention: str) -> None:
    if curriculum is None:
        return
    if not policy_class(attention).has_delta:
        raise UserError(f"delta_curriculum is for GMA models; this recipe trains {attention!r} attention")
    ok = isinstance(curriculum, (list, tuple)) and len(curriculum) == 2
    if not ok or not float(curriculum[0]) > 0 or int(curriculum[1]) < 1:
        raise UserError(f"delta_curriculum must be [δ_start > 0, updates >= 1], got {curriculum!r}")


def check_delta_sample(choices, curriculum, attention: str) -> None:
    if choices is None:
        return
    if not policy_class(attention).has_delta:
        raise UserError(f"delta_sample is for GMA models; this recipe trains {attention!r} attention")
    if curriculum is not None:
        raise UserError("delta_sample and delta_curriculum cannot be combined: pick one δ schedule")
    ok = isinstance(choices, (list, tuple)) and choices and all(
        isinstance(d, (int, float)) and not isinstance(d, bool) and d > 0 for d in choices)
    if not ok:
        raise UserError(f"delta_sample must be a non-empty list of δ > 0, got {choices!r}")


def sample_delta(seed: int, step: int, b: int, choices: list, rank: int = 0) -> list[float]:
    """One δ per sentence of update `step`, uniform over `choices`; derived from (seed, step) like
    sample_k, so a resumed run draws the same δs, and from the process's rank, so that the processes of
    a multi-GPU run draw their own (rank 0 draws what a single process does)."""
    rng = random.Random(seed * 1_000_033 + step + rank * 7_919_993)
    return [float(rng.choice(choices)) for _ in range(b)]


def train_delta(cfg: ModelConfig, b: int, device, delta) -> torch.Tensor | None:
    """The (b,) δ of a GMA training batch: `delta` (a curriculum's value or one δ per sentence) or
    the model's default."""
    if not policy_class(cfg).has_delta:
        return None
    if isinstance(delta, (list, tuple)):
        return torch.tensor(delta, dtype=torch.float32, device=device)
    return torch.full((b,), float(cfg.default_delta if delta is None else delta), device=device)


def batch_loss(model, batch, cfg: ModelConfig, k: int | None, smoothing: float, delta=None,
               unlikelihood: float = 0.0, stutter: int = 12, ngram: int = 0, teacher=None,
               teacher_weight: float = 1.0):
    """The batch's summed cross-entropy (mixed with the distillation term when a `teacher` is given,
    plus `unlikelihood` times the repeat term, when set) and its number of target tokens."""
    src, src_len, tgt_in, tgt_out = batch
    b = src.shape[0]
    kk = torch.full((b,), k, device=src.device) if k is not None else None
    delta = train_delta(cfg, b, src.device, delta)
    logits = model(src, src_len, tgt_in, kk, delta)
    ntok = int((tgt_out != cfg.pad_id).sum())
    flat = logits.float().view(-1, logits.shape[-1])
    if unlikelihood or teacher is not None:
        # every term reads one log-softmax: the vocabulary's normaliser is taken once, not once per term
        logp = F.log_softmax(flat, -1)
        loss = smoothed_nll(logp, tgt_out.view(-1), cfg.pad_id, smoothing)
    else:
        loss = F.cross_entropy(flat, tgt_out.view(-1), ignore_index=cfg.pad_id, label_smoothing=smoothing,
                               reduction="sum")
    if teacher is not None:
        loss = (1 - teacher_weight) * loss + teacher_weight * distillation_loss(teacher, batch, cfg, kk, delta, logp)
    if unlikelihood:
        loss = loss + unlikelihood * unlikelihood_loss(logp, tgt_out, cfg.pad_id, stutter, ngram, log_probs=True)
    return loss, ntok


def smoothed_nll(logp: torch.Tensor, target: torch.Tensor, pad_id: int, smoothing: float) -> torch.Tensor:
    """F.cross_entropy(..., ignore_index=pad_id, label_smoothing=smoothing, reduction="sum") from
    log-probabilities (N, V) already taken: (1 - s) * -log p(gold) + s * the mean of -log p over the vocabulary."""
    keep = target != pad_id
    nll = -logp.gather(1, target.clamp(min=0).unsqueeze(1)).squeeze(1)
    if smoothing:
        nll = (1 - smoothing) * nll - smoothing * logp.mean(-1)
    return (nll * keep).sum()


def distillation_loss(teacher, batch, cfg: ModelConfig, kk, delta, logp: torch.Tensor) -> torch.Tensor:
    """Summed KL(teacher || model) over the batch's target tokens; `logp` the model's (B*T, V) log-probabilities.
    The teacher sees what its own policy reads: wait-k's k, GMA's δ, or neither."""
    src, src_len, tgt_in, tgt_out = batch
    rule = policy_class(teacher.cfg)
    with torch.no_grad():
        t_logits = teacher(src, src_len, tgt_in, kk if rule.has_k else None, delta if rule.has_delta else None)
    keep = (tgt_out != cfg.pad_id).view(-1)
    t_logp = F.log_softmax(t_logits.float().view(-1, logp.shape[-1])[keep], -1)
    return F.kl_div(logp[keep], t_logp, log_target=True, reduction="sum")


def is_mask_parameter(name: str) -> bool:
    """Calibration's mask projections: they learn only from L_m (models/variants/calibration.py)."""
    return ".calib.q_m." in name or ".calib.k_m." in name


def calibration_losses(model, batch, cfg: ModelConfig, k: int | None, smoothing: float, delta=None):
    """Attention calibration (Lu et al. 2021), both passes of one batch.

    Pass A (a^comb): L_NMT, the summed label-smoothed CE. Pass B (a^p, the attention
    perturbed by the mask): L_m = −L_NMT(a^p) / ntok + α_c · ‖1 − m‖₂, the norm taken per
    sentence and layer over its valid (head, target, source) entries and averaged (our
    normalisation; the paper gives neither it nor α_c). Returns (L_NMT sum, ntok, L_m)."""
    src, src_len, tgt_in, tgt_out = batch
    b = src.shape[0]
    kk = torch.full((b,), k, device=src.device) if k is not None else None
    delta = train_delta(cfg, b, src.device, delta)
    ntok = int((tgt_out != cfg.pad_id).sum())

    def ce(logits):
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), tgt_out.view(-1),
                               ignore_index=cfg.pad_id, label_smoothing=smoothing, reduction="sum")

    loss_nmt = ce(model(src, src_len, tgt_in, kk, delta))
    logits_p, info = model(src, src_len, tgt_in, kk, delta, perturbed=True, return_info=True)
    tgt_valid = (tgt_out != cfg.pad_id).float().view(b, 1, -1, 1)
    norms = [(((1 - m) * tgt_valid) ** 2).sum((1, 2, 3)).clamp_min(1e-12).sqrt() for m in info["masks"]]
    reg = torch.stack(norms).mean()
    alpha_c = cfg.variant.calibration_alpha
    loss_m = -ce(logits_p) / max(ntok, 1) + alpha_c * reg
    return loss_nmt, ntok, loss_m


def calibration_backward(model, loss_nmt, ntok: int, loss_m, scale=lambda x: x) -> None:
    """Accumulate L_NMT's gradients into every parameter but the mask's, and L_m's into the
    mask's only (each loss also reaches the other group through the graph: cut here)."""
    mask = [p for n, p in model.named_parameters() if is_mask_parameter(n)]
    rest = [p for n, p in model.named_parameters() if not is_mask_parameter(n)]
    scale(loss_nmt / max(ntok, 1)).backward(inputs=rest, retain_graph=True)
    scale(loss_m).backward(inputs=mask)


def set_update_step(model, step: int) -> None:
    """Where the calibration's anneal schedule γ(s) is (s = updates done): kept in the weights."""
    for layer in getattr(model, "decoder", []):
        if getattr(layer, "calib", None) is not None:
            layer.calib.update_step.fill_(float(step))


def sample_k(seed: int, step: int, src_max: int) -> int:
    """Multipath wait-k: one k per batch, uniform in 1..padded source length,
    derived from (seed, step) so a resumed run draws the same ks."""
    return random.Random(seed * 1_000_003 + step).randint(1, src_max)


def validation_loss(model, cfg: ModelConfig, examples, max_tokens: int, device=None) -> float:
    """Loss per target token on encoded pairs, no label smoothing (GMA at the model's δ, wait-k at its
    default k): the validation loss of training, and of recipes/valid_loss.py choosing among checkpoints."""
    total, ntok = 0.0, 0
    k = cfg.default_k if policy_class(cfg).has_k else None
    with torch.no_grad():
        for idx in make_batches(examples, max_tokens, 0, 0):
            batch = collate(examples, idx, cfg.pad_id, cfg.bos_id, cfg.eos_id, device)
            loss, n = batch_loss(model, batch, cfg, k, 0.0)
            total += float(loss)
            ntok += n
    return total / max(ntok, 1)


def check_training_terms(tc: TrainConfig, cfg: ModelConfig) -> None:
    """Clear errors for the unlikelihood and distillation settings before any data is read."""
    if isinstance(tc.unlikelihood, bool) or not isinstance(tc.unlikelihood, (int, float)) or tc.unlikelihood < 0:
        raise UserError(f"unlikelihood must be a weight >= 0 (0: off), got {tc.unlikelihood!r}")
    for key in ("unlikelihood_stutter", "unlikelihood_ngram"):
        value = getattr(tc, key)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 16:
            raise UserError(f"{key} must be an integer from 0 (off) to 16, got {value!r}")
    if not isinstance(tc.teacher_weight, (int, float)) or not 0 <= tc.teacher_weight <= 1:
        raise UserError(f"teacher_weight must be from 0 to 1, got {tc.teacher_weight!r}")
    if (tc.unlikelihood or tc.teacher) and cfg.variant.kind == "calibration":
        raise UserError("unlikelihood and teacher do not combine with the calibration variant's two losses")


def load_teacher(path: str, tok: Tokenizer, device) -> Transformer:
    """The frozen distillation teacher at `path`; its vocabulary must be the model's (`tok`)."""
    from models.checkpoint import load_checkpoint
    teacher, teacher_tok, _ = load_checkpoint(path, device=device)
    why = vocabulary_difference(teacher_tok, tok)
    if why:
        raise UserError(f"teacher {path} has another vocabulary than the data's spm.model ({why}): "
                        "distillation needs the same one")
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher.eval()


def freeze_all_but(model, patterns: list | None) -> list:
    """The parameters to train: those matching `patterns` (fnmatch on their names; the rest stop taking
    gradients), or all of them when `patterns` is None."""
    if patterns is None:
        return list(model.parameters())
    if isinstance(patterns, str) or not isinstance(patterns, list):
        raise UserError(f"train_only must be a list of parameter name patterns, got {patterns!r}")
    trained = []
    for name, p in model.named_parameters():
        p.requires_grad_(any(fnmatch.fnmatchcase(name, pat) for pat in patterns))
        if p.requires_grad:
            trained.append(p)
    if not trained:
        raise UserError(f"train_only {patterns} matches no parameter (names look like "
                        f"{next(iter(dict(model.named_parameters())))!r})")
    return trained


class Trainer:
    def __init__(self, tc: TrainConfig, tokenizer: Tokenizer | None = None,
                 train_pairs=None, valid_pairs=None, progress: bool = True):
        self.tc, self.progress = tc, progress
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.device = pick_device(tc.device)
        if self.world > 1 and not dist.is_initialized():
            if self.device.type == "cuda":
                self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
                torch.cuda.set_device(self.device)
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
        if tc.threads:
            torch.set_num_threads(tc.threads)
        self.out = Path(tc.output)
        data = Path(tc.data) if tc.data else None
        if tokenizer is None and (data is None or not (data / "spm.model").is_file()):
            raise UserError(f"training needs a data directory with spm.model, train.* and valid.*; "
                            f"{'the recipe names none (data:)' if data is None else f'{data} has no spm.model'} "
                            f"(`simulserve prepare-data --out DIR` builds one)")
        self.tok = tokenizer or Tokenizer(data / "spm.model")
        mcfg = dict(tc.model, vocab_size=self.tok.vocab_size, src_lang=tc.src_lang, tgt_lang=tc.tgt_lang,
                    **self.tok.special_ids)
        self.cfg = ModelConfig.from_dict(mcfg)
        check_delta_curriculum(tc.delta_curriculum, self.cfg.attention)
        check_delta_sample(tc.delta_sample, tc.delta_curriculum, self.cfg.attention)
        check_training_terms(tc, self.cfg)
        if train_pairs is None:
            train_pairs = read_parallel(data / "train", tc.src_lang, tc.tgt_lang)
            valid_pairs = read_parallel(data / "valid", tc.src_lang, tc.tgt_lang)
            train_pairs += oversampled(data, tc.oversample, tc.src_lang, tc.tgt_lang)
        self.train_ex = encode_pairs(train_pairs, self.tok, self.cfg.max_positions)
        self.valid_ex = encode_pairs(valid_pairs or [], self.tok, self.cfg.max_positions)
        torch.manual_seed(tc.seed)
        self.model = Transformer(self.cfg).to(self.device)
        self.init_steps = 0  # updates behind the weights this run started from (learning-curve x axis)
        if tc.init_from:
            from models.checkpoint import load_checkpoint
            init, init_tok, info = load_checkpoint(tc.init_from)
            why = vocabulary_difference(init_tok, self.tok)
            if why:   # (its embeddings would be copied to other pieces' ids, or dropped)
                raise UserError(f"init_from {tc.init_from} has another vocabulary than the data's spm.model "
                                f"({why}): build the data with `simulserve prepare-data --vocab-from "
                                f"{tc.init_from}`")
            self._load_matching(init.state_dict())
            self.init_steps = int(info.get("steps", 0)) + int(info.get("init_steps", 0))
        self.teacher = None
        if tc.teacher:
            self.teacher = load_teacher(tc.teacher, self.tok, self.device)
        trained = freeze_all_but(self.model, tc.train_only)
        self.opt = torch.optim.Adam(trained, lr=tc.lr, betas=tuple(tc.betas), eps=1e-8)
        self.step, self.epoch, self.position = 0, 0, 0
        self.amp_dtype = None
        if self.device.type == "cuda":
            self.amp_dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp_dtype == torch.float16)
        self.net = self.model
        if self.world > 1:
            self.net = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        self.resumed = self._resume()

    def _load_matching(self, state: dict) -> None:
        """Fine-tuning: copy every tensor whose name and shape match (e.g. GMA δ=2 from δ=1)."""
        own = self.model.state_dict()
        own.update({k: v.to(own[k].dtype) for k, v in state.items() if k in own and own[k].shape == v.shape})
        self.model.load_state_dict(own)

    # ---- resumable state ----------------------------------------------------
    def _state_dir(self) -> Path:
        return self.out / "train_state"

    def save_state(self) -> None:
        if self.rank != 0:
            return
        d = self._state_dir()
        tmp = d.with_name("train_state.tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()},
                  str(tmp / "model.safetensors"))
        opt_tensors, opt_steps = {}, {}
        for i, p in enumerate(self.model.parameters()):
            st = self.opt.state.get(p)
            if st:
                opt_tensors[f"{i}.exp_avg"] = st["exp_avg"].cpu().contiguous()
                opt_tensors[f"{i}.exp_avg_sq"] = st["exp_avg_sq"].cpu().contiguous()
                opt_steps[i] = float(st["step"])
        save_file(opt_tensors or {"empty": torch.zeros(1)}, str(tmp / "optimizer.safetensors"))
        save_file({"torch": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
        meta = {"step": self.step, "epoch": self.epoch, "position": self.position, "init_steps": self.init_steps,
                "opt_steps": opt_steps, "model": self.cfg.to_dict(), "train": asdict(self.tc)}
        (tmp / "state.json").write_text(json.dumps(meta, indent=1))
        if d.exists():
            old = d.with_name("train_state.old")
            d.rename(old)
            tmp.rename(d)
            for f in old.iterdir():
                f.unlink()
            old.rmdir()
        else:
            tmp.rename(d)

    def _resume(self) -> bool:
        d = self._state_dir()
        if not (d / "state.json").is_file():
            return False
        meta = json.loads((d / "state.json").read_text())
        # through ModelConfig, so a state saved before a field existed (filled by its default) still resumes
        if ModelConfig.from_dict(meta["model"]) != self.cfg:
            raise UserError(f"{d}: saved model config differs from this run's; use another output directory")
        self.model.load_state_dict(load_file(str(d / "model.safetensors"), device=str(self.device)))
        opt = load_file(str(d / "optimizer.safetensors"), device=str(self.device))
        for i, p in enumerate(self.model.parameters()):
            if f"{i}.exp_avg" in opt:
                self.opt.state[p] = {"step": torch.tensor(meta["opt_steps"][str(i)]),
                                     "exp_avg": opt[f"{i}.exp_avg"], "exp_avg_sq": opt[f"{i}.exp_avg_sq"]}
        torch.set_rng_state(load_file(str(d / "rng.safetensors"))["torch"])
        self.step, self.epoch, self.position = meta["step"], meta["epoch"], meta["position"]
        # init_from may hold other weights by now (a fine-tune's result copied over what it started from)
        self.init_steps = meta.get("init_steps", self.init_steps)
        return True

    # ---- the loop --------------------------------------------------------------
    def validate(self) -> float | None:
        if not self.valid_ex:
            return None
        self.model.eval()
        loss = validation_loss(self.model, self.cfg, self.valid_ex, self.tc.max_tokens, self.device)
        self.model.train()
        return loss

    def train(self) -> dict:
        tc, cfg = self.tc, self.cfg
        start = last_save = time.monotonic()
        self.model.train()
        history = []
        stop = None
        interrupted = _StopOnSignal()
        try:  # the handlers go back even if an update raises
            if tc.snapshot_every and self.step == 0 and self.rank == 0:
                self.snapshot()  # the starting point of the learning curve
            if self.rank == 0:
                print(f"training {tc.output} from update {self.step}; Ctrl-C or SIGTERM saves and stops",
                      file=sys.stderr, flush=True)
            while self.epoch < tc.max_epochs and stop is None:
                batches = make_batches(self.train_ex, tc.max_tokens, tc.seed, self.epoch)
                batches = batches[: len(batches) - len(batches) % self.world or None][self.rank::self.world]
                bar = tqdm(total=len(batches), initial=self.position, disable=not self.progress or self.rank != 0,
                           desc=f"epoch {self.epoch + 1}", unit="batch", dynamic_ncols=True)
                run_loss, run_tok = 0.0, 0
                win_loss, win_tok = 0.0, 0
                for idx in batches[self.position:]:
                    batch = collate(self.train_ex, idx, cfg.pad_id, cfg.bos_id, cfg.eos_id, self.device)
                    k = sample_k(tc.seed, self.step, batch[0].shape[1]) if policy_class(cfg).has_k else None
                    self.step += 1
                    lr = inverse_sqrt_lr(self.step, tc.lr, tc.warmup)
                    for g in self.opt.param_groups:
                        g["lr"] = lr
                    set_update_step(self.model, self.step - 1)  # γ(s) of calibration's anneal: s = updates done
                    delta = curriculum_delta(self.step - 1, tc.delta_curriculum, cfg.default_delta)
                    if tc.delta_sample:
                        delta = sample_delta(tc.seed, self.step, batch[0].shape[0], tc.delta_sample, self.rank)
                    calibrating = cfg.variant.kind == "calibration"
                    with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
                        if calibrating:
                            loss, ntok, loss_m = calibration_losses(self.net, batch, cfg, k, tc.label_smoothing,
                                                                    delta)
                        else:
                            loss, ntok = batch_loss(self.net, batch, cfg, k, tc.label_smoothing, delta,
                                                    tc.unlikelihood, tc.unlikelihood_stutter,
                                                    tc.unlikelihood_ngram, self.teacher, tc.teacher_weight)
                    self.opt.zero_grad(set_to_none=True)
                    if calibrating:  # the two losses' gradients kept apart (mask vs everything else)
                        calibration_backward(self.model, loss, ntok, loss_m, self.scaler.scale)
                    else:
                        self.scaler.scale(loss / max(ntok, 1)).backward()
                    self.scaler.step(self.opt)
                    self.scaler.update()
                    self.position += 1
                    run_loss += float(loss.detach())
                    run_tok += ntok
                    bar.update(1)
                    win_loss += float(loss.detach())
                    win_tok += ntok
                    if tc.snapshot_every and self.step % tc.snapshot_every == 0 and self.rank == 0:
                        self.snapshot()
                    if self.step % LOG_EVERY == 0:
                        # the mean of the last LOG_EVERY updates: a learning curve that survives restarts
                        window = {"step": self.step, "loss": round(win_loss / max(win_tok, 1), 4),
                                  "lr": lr, "tokens": win_tok, "epoch": self.epoch + 1}
                        if tc.delta_curriculum:
                            window["delta"] = round(delta, 4)   # the δ of this window's last update
                        self._log_updates(window)
                        bar.set_postfix(loss=f"{win_loss / max(win_tok, 1):.3f}", lr=f"{lr:.2e}", step=self.step)
                        win_loss, win_tok = 0.0, 0
                    minutes = (time.monotonic() - start) / 60
                    if tc.max_steps and self.step >= tc.max_steps:
                        stop = "max_steps"
                    elif tc.max_minutes and minutes >= tc.max_minutes:
                        stop = "max_minutes"
                    elif interrupted.signal:
                        stop = interrupted.signal
                    if stop:
                        break
                    if (time.monotonic() - last_save) / 60 >= tc.save_every_minutes:
                        self.save_state()
                        if self.rank == 0 and not self.epoch:  # a usable checkpoint before epoch 1 ends
                            self.export()
                        last_save = time.monotonic()
                bar.close()
                if self.position >= len(batches):
                    self.epoch += 1
                    self.position = 0
                    rec = {"epoch": self.epoch, "step": self.step, "train_loss": run_loss / max(run_tok, 1),
                           "valid_loss": self.validate(), "minutes": round((time.monotonic() - start) / 60, 2)}
                    history.append(rec)
                    if self.rank == 0:
                        self._end_of_epoch(rec)
                self.save_state()
                if stop and self.rank == 0 and not self.epoch:  # keep the checkpoint as fresh as the state
                    self.export()
        finally:
            interrupted.restore()
        if self.world > 1:
            dist.barrier()
        return {"step": self.step, "epoch": self.epoch, "stopped": stop or "max_epochs", "history": history,
                "resumed": self.resumed}

    def _log_updates(self, rec: dict) -> None:
        if self.rank != 0:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / "updates.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")

    def _end_of_epoch(self, rec: dict) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / "log.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        tqdm.write(f"epoch {rec['epoch']} step {rec['step']}: train {rec['train_loss']:.3f} "
                   f"valid {rec['valid_loss'] if rec['valid_loss'] is None else round(rec['valid_loss'], 3)}")
        ep = self.out / "epochs"
        ep.mkdir(exist_ok=True)
        save_file({k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()},
                  str(ep / f"epoch{self.epoch:03d}.safetensors"))
        self.export()

    def _training_info(self, averaged: list[str]) -> dict:
        """What a written checkpoint records about how it was trained."""
        return {"steps": self.step, "init_steps": self.init_steps, "epochs": self.epoch, "averaged": averaged,
                "train_config": asdict(self.tc)}

    def snapshot(self) -> Path:
        """The current (not averaged) weights as a checkpoint, kept for learning curves."""
        return save_checkpoint(self.out / "snapshots" / f"step{self.step:06d}", self.model, self.tok,
                               self._training_info([]))

    def export(self) -> Path:
        """Average the last N epoch weights into OUTPUT/checkpoint (fp16)."""
        files = sorted((self.out / "epochs").glob("epoch*.safetensors"))[-self.tc.average_last:]
        # before the first epoch ends there is nothing to average: export the current weights
        model = Transformer(self.cfg)
        model.load_state_dict(average_weights(files) if files else self.model.state_dict())
        set_update_step(model, self.step)  # the anneal's γ at the end of training, not an average
        return save_checkpoint(self.out / "checkpoint", model, self.tok,
                               self._training_info([f.name for f in files]))


class _StopOnSignal:
    """SIGINT/SIGTERM end training after the current update, with the state saved (nothing lost)."""

    def __init__(self):
        self.signal = None
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if self.signal:  # a second signal: stop at once
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum).name
        # os.write, not tqdm.write: a handler runs between any two bytecodes, also in the middle of an import, and
        # tqdm's first lock imports a module (Python 3.11's importlib then fails with a KeyError)
        try:
            os.write(2, f"\n{self.signal}: saving after this update (send again to stop at once)\n".encode())
        except OSError:
            pass

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def average_weights(paths: list[Path]) -> dict:
    total = None
    for p in paths:
        sd = load_file(str(p))
        if total is None:
            total = {k: v.double() for k, v in sd.items()}
        else:
            for k, v in sd.items():
                total[k] += v.double()
    return {k: (v / len(paths)).float() for k, v in total.items()}
