"""Model configuration that travels with the weights (saved as config.json)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from models.errors import UserError

ATTENTION_KINDS = ("standard", "waitk", "gma")


class ConfigError(UserError):
    """A configuration (or checkpoint config.json) is malformed or inconsistent."""


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int = 256
    n_heads: int = 4
    d_ffn: int = 1024
    encoder_layers: int = 3
    decoder_layers: int = 3
    dropout: float = 0.1
    attention_dropout: float = 0.0
    max_positions: int = 256
    # "standard" = full cross-attention (offline), "waitk" = prefix mask, "gma" = Gaussian window
    attention: str = "standard"
    causal_encoder: bool = True
    # policy defaults, overridable per stream
    default_k: int = 3
    default_delta: float = 1.0
    src_lang: str = "de"
    tgt_lang: str = "en"
    pad_id: int = 0
    unk_id: int = 1
    bos_id: int = 2
    eos_id: int = 3
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        self.validate()

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def policy(self) -> str:
        """The decoding policy this model was trained for."""
        return {"standard": "offline", "waitk": "waitk", "gma": "gma"}[self.attention]

    def validate(self) -> None:
        if self.attention not in ATTENTION_KINDS:
            raise ConfigError(f"attention must be one of {ATTENTION_KINDS}, got {self.attention!r}")
        for name in ("vocab_size", "d_model", "n_heads", "d_ffn", "encoder_layers",
                     "decoder_layers", "max_positions"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.attention in ("waitk", "gma") and not self.causal_encoder:
            raise ConfigError(f"a {self.attention} model needs causal_encoder=true (streaming encoder)")
        if not (isinstance(self.default_k, int) and self.default_k >= 1):
            raise ConfigError(f"default_k must be an integer >= 1, got {self.default_k!r}")
        if not (isinstance(self.default_delta, (int, float)) and self.default_delta >= 0):
            raise ConfigError(f"default_delta must be >= 0, got {self.default_delta!r}")
        ids = (self.pad_id, self.unk_id, self.bos_id, self.eos_id)
        if len(set(ids)) != 4 or max(ids) >= self.vocab_size or min(ids) < 0:
            raise ConfigError(f"special ids {ids} must be distinct and < vocab_size")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        if not isinstance(d, dict):
            raise ConfigError("model config must be a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown model config fields: {unknown}")
        if "vocab_size" not in d:
            raise ConfigError("model config lacks vocab_size")
        try:
            return cls(**d)
        except TypeError as e:
            raise ConfigError(f"bad model config: {e}") from None
