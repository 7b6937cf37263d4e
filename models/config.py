"""Model configuration that travels with the weights (saved as config.json)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from models.errors import UserError

ATTENTION_KINDS = ("standard", "waitk", "gma")
# cross-attention variants of the source papers (docs/attention_variants.md); "none" = plain softmax
VARIANT_KINDS = ("none", "gmm", "sact", "phrase", "calibration")
# which policies (the `attention` field) each variant composes with, and why the others do not:
# GMM's Gaussians are placed with the full source length J, which a stream does not know yet
VARIANT_POLICIES = {"none": ATTENTION_KINDS, "gmm": ("standard",), "sact": ATTENTION_KINDS,
                    "phrase": ATTENTION_KINDS, "calibration": ATTENTION_KINDS}


class ConfigError(UserError):
    """A configuration (or checkpoint config.json) is malformed or inconsistent."""


def _number(name, v, lo=None, hi=None, integer=False, lo_open=False):
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if not ok or isinstance(v, bool) or v != v:
        raise ConfigError(f"variant.{name} must be {'an integer' if integer else 'a number'}, got {v!r}")
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise ConfigError(f"variant.{name} must be {'>' if lo_open else '>='} {lo}, got {v!r}")
    if hi is not None and v > hi:
        raise ConfigError(f"variant.{name} must be <= {hi}, got {v!r}")


@dataclass(frozen=True)
class VariantConfig:
    """The cross-attention variant of the decoder and its parameters (only the kind's own are used).

    gmm: K Gaussians per head mixed into softmax attention by a gate (Zhang & Feng 2021).
    sact: softmax temperature τ = λ^tanh(·) per step and layer (Lin et al. 2018).
    phrase: keys (convkv: and values) convolved over n consecutive source positions
      (Nguyen & Joty); homogeneous = head h uses n-grams of size 1 + h mod n, heterogeneous =
      every head attends to all sizes 1..n jointly, interleaved = unigram and bigram queries
      each attend to the heterogeneous unigram/bigram entries, their contexts combined by a
      stride-2 convolution (n = 2 only; the query of the previous target position is carried).
    calibration: a learned mask m recalibrates the attention (Lu et al. 2021).
    """
    kind: str = "none"
    gmm_components: int = 4
    gmm_sigma_floor: float = 0.5       # AMBIG in the paper: σ has no lower bound (see the spec)
    gmm_gate_bias: float = -4.0        # b_g2 at init: g ≈ 0.018, close to standard attention
    sact_lambda: float = 4.0
    phrase_mode: str = "convkv"        # convkv | queryk
    phrase_n: int = 2
    phrase_structure: str = "homogeneous"  # homogeneous | heterogeneous | interleaved
    calibration_mode: str = "anneal"   # fixed | anneal | gate
    calibration_alpha: float = 0.01    # α_c of L_m (not given in the paper)
    calibration_anneal_steps: float = 1e5  # γ(s) = exp(-s / this); the paper: 10^5

    @classmethod
    def from_value(cls, v) -> "VariantConfig":
        if isinstance(v, VariantConfig):
            return v
        if isinstance(v, str):
            v = {"kind": v}
        if not isinstance(v, dict):
            raise ConfigError(f"variant must be a JSON object (or a kind name), got {v!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(v) - known)
        if unknown:
            raise ConfigError(f"unknown variant fields: {unknown}")
        return cls(**v)

    @property
    def carries_context(self) -> bool:
        """Whether a decoder step needs a per-layer vector from the stream's last written step:
        SACT's context c̃_{t−1}, or the interleaved phrase structure's input x_{t−1} (its bigram query)."""
        return self.kind == "sact" or (self.kind == "phrase" and self.phrase_structure == "interleaved")

    def __post_init__(self):
        if self.kind not in VARIANT_KINDS:
            raise ConfigError(f"variant.kind must be one of {VARIANT_KINDS}, got {self.kind!r}")
        _number("gmm_components", self.gmm_components, 1, 64, integer=True)
        _number("gmm_sigma_floor", self.gmm_sigma_floor, 0, lo_open=True)
        _number("gmm_gate_bias", self.gmm_gate_bias, -1e4, 1e4)
        _number("sact_lambda", self.sact_lambda, 1, 100, lo_open=True)
        _number("phrase_n", self.phrase_n, 1, 8, integer=True)
        if self.phrase_mode not in ("convkv", "queryk"):
            raise ConfigError(f"variant.phrase_mode must be convkv or queryk, got {self.phrase_mode!r}")
        if self.phrase_structure not in ("homogeneous", "heterogeneous", "interleaved"):
            raise ConfigError("variant.phrase_structure must be homogeneous, heterogeneous or interleaved, "
                              f"got {self.phrase_structure!r}")
        if self.kind == "phrase" and self.phrase_structure == "interleaved" and self.phrase_n != 2:
            raise ConfigError("variant.phrase_structure 'interleaved' combines unigrams and bigrams: "
                              f"phrase_n must be 2, got {self.phrase_n}")
        if self.calibration_mode not in ("fixed", "anneal", "gate"):
            raise ConfigError(f"variant.calibration_mode must be fixed, anneal or gate, got {self.calibration_mode!r}")
        _number("calibration_alpha", self.calibration_alpha, 0)
        _number("calibration_anneal_steps", self.calibration_anneal_steps, 0, lo_open=True)


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
    # the decoder's cross-attention variant (docs/attention_variants.md); composes with `attention`
    variant: VariantConfig = field(default_factory=VariantConfig)
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "variant", VariantConfig.from_value(self.variant))
        self.validate()

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def policy(self) -> str:
        """The decoding policy this model was trained for."""
        from models.policies import policy_class
        return policy_class(self).name

    def validate(self) -> None:
        from models.policies import POLICIES, policy_class   # the built-in kinds and any registered one
        if self.attention not in POLICIES:
            raise ConfigError(f"attention must be one of {tuple(POLICIES)}, got {self.attention!r}")
        for name in ("vocab_size", "d_model", "n_heads", "d_ffn", "encoder_layers",
                     "decoder_layers", "max_positions"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if policy_class(self).streams and not self.causal_encoder:
            raise ConfigError(f"a {self.attention} model needs causal_encoder=true (streaming encoder)")
        if not (isinstance(self.default_k, int) and self.default_k >= 1):
            raise ConfigError(f"default_k must be an integer >= 1, got {self.default_k!r}")
        if not (isinstance(self.default_delta, (int, float)) and self.default_delta >= 0):
            raise ConfigError(f"default_delta must be >= 0, got {self.default_delta!r}")
        v = self.variant.kind
        if v != "none" and self.attention not in VARIANT_POLICIES[v]:
            raise ConfigError(f"the {v} attention variant does not compose with attention={self.attention!r} "
                              f"(it does with {', '.join(VARIANT_POLICIES[v])}; see docs/attention_variants.md)")
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
