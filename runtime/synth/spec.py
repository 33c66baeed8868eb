"""What a synthetic Clover model looks like: its shape, quantization, variants and seed.

One frozen dataclass holds every choice so a spec can key a cache and be written twice to the
same bytes. Presets cover the sizes tests and benchmarks need; any field can be overridden.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from ..errors import CloverError

ARCHITECTURES = ("clover-moe", "qwen35moe", "qwen3next")
VOCABULARIES = ("small", "qwen36")
PRESETS = ("tiny", "small", "real-shape")
# Whole-file quant choices; "Q4_K_M" is the llama.cpp-style mix (see `weights.plan_tensors`).
QUANTS = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q4_K_M", "Q5_K", "Q6_K")
REAL_VOCAB_ROWS = 248_320  # the real model pads its embedding to this many rows


@dataclass(frozen=True)
class SynthSpec:
    """Every hyper-parameter and file-layout choice of one synthetic model."""

    arch: str = "clover-moe"
    name: str = "clover-synth"
    hidden: int = 64
    n_layer: int = 4
    full_attention_interval: int = 4  # layer i is full attention iff (i + 1) % interval == 0
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32
    head_dim_v: int | None = None  # None: same as head_dim
    rope_dim: int = 8
    rope_base: float = 1e7
    rms_eps: float = 1e-6
    ssm_k_heads: int = 2
    ssm_v_heads: int = 4
    ssm_state: int = 16  # key dimension per GDN head (`ssm.state_size`)
    ssm_v_dim: int | None = None  # None: same as ssm_state
    conv_kernel: int = 4
    n_expert: int = 8
    n_expert_used: int = 2
    expert_ff: int = 32
    shared_ff: int = 32
    vocab: str = "small"
    n_vocab: int | None = None  # embedding rows; None: 248,320 for qwen36, else tokens rounded up to 64
    context_length: int = 4096
    quant: str = "F32"
    fused_qkv: bool = False  # attention layers: one attn_qkv instead of attn_q / attn_k / attn_v
    fused_gate_up: bool = False  # experts: one ffn_gate_up_exps instead of ffn_gate_exps + ffn_up_exps
    tied_output: bool = False  # no output.weight: the LM head is token_embd
    clover_tensors: bool = True  # the Clover-only GDN preview tensors
    diffusion_keys: bool = True  # {arch}.diffusion.* and tokenizer.ggml.mask_token_id
    block_length: int = 32
    threshold: float = 0.9
    shift_logits: bool = True
    chat_template: bool = True  # write tokenizer.chat_template (the Qwen3.6 template)
    # general.sampling.* keys written (llama.cpp's names, e.g. {"temp": 0.0}); greedy by default, so
    # random-weight test models answer the same every time unless a test asks for sampling
    sampling: tuple[tuple[str, float], ...] | None = (("temp", 0.0),)
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "quant", normalize_quant(self.quant))
        validate(self)

    @property
    def v_head_dim(self) -> int:
        return self.head_dim_v if self.head_dim_v is not None else self.head_dim

    @property
    def gdn_v_dim(self) -> int:
        return self.ssm_v_dim if self.ssm_v_dim is not None else self.ssm_state

    @property
    def ssm_inner(self) -> int:
        return self.ssm_v_heads * self.gdn_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.ssm_k_heads * self.ssm_state + self.ssm_inner

    def is_attention(self, layer: int) -> bool:
        return (layer + 1) % self.full_attention_interval == 0

    def with_(self, **changes: Any) -> SynthSpec:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def tiny(cls, **overrides: Any) -> SynthSpec:
        """Hidden 64, 4 layers (attention at layer 3), 8 experts top-2, small vocabulary."""
        return cls(**overrides)

    @classmethod
    def small(cls, **overrides: Any) -> SynthSpec:
        """Like tiny, but every row length is a multiple of 256 so K-quants apply to every matrix."""
        base: dict[str, Any] = dict(
            hidden=256, n_head=4, n_head_kv=2, head_dim=64, rope_dim=16, ssm_k_heads=2, ssm_v_heads=4,
            ssm_state=64, expert_ff=256, shared_ff=256, name="clover-synth-small",
        )
        base.update(overrides)
        return cls(**base)

    @classmethod
    def real_shape(cls, n_layer: int = 40, **overrides: Any) -> SynthSpec:
        """The Clover-35B-A3B shape (docs/architecture.md §1); the vocabulary is padded to 248,320 rows."""
        base: dict[str, Any] = dict(
            name="clover-synth-real-shape", hidden=2048, n_layer=n_layer, full_attention_interval=4,
            n_head=16, n_head_kv=2, head_dim=256, rope_dim=64, rope_base=1e7, ssm_k_heads=16,
            ssm_v_heads=32, ssm_state=128, conv_kernel=4, n_expert=256, n_expert_used=8, expert_ff=512,
            shared_ff=512, n_vocab=REAL_VOCAB_ROWS, context_length=131_072, quant="Q4_K_M",
        )
        base.update(overrides)
        return cls(**base)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> SynthSpec:
        """A preset by its command-line name ("tiny", "small", "real-shape"), with overrides."""
        key = name.strip().lower().replace("_", "-")
        if key == "tiny":
            return cls.tiny(**overrides)
        if key == "small":
            return cls.small(**overrides)
        if key in ("real-shape", "real"):
            return cls.real_shape(**overrides)
        raise CloverError(f"unknown preset '{name}' (choose from {', '.join(PRESETS)})")


def normalize_quant(quant: str) -> str:
    """Canonical quant name ("q4_k_m" -> "Q4_K_M"); CloverError for one we cannot write."""
    q = quant.strip().upper()
    if q not in QUANTS:
        raise CloverError(f"unknown quant '{quant}' (choose from {', '.join(QUANTS)})")
    return q


def validate(spec: SynthSpec) -> None:
    """Raise CloverError for a spec that cannot describe a valid model."""
    def bad(msg: str) -> CloverError:
        return CloverError(f"invalid synthetic model spec: {msg}")

    if spec.arch not in ARCHITECTURES:
        raise bad(f"unknown architecture '{spec.arch}' (choose from {', '.join(ARCHITECTURES)})")
    if spec.vocab not in VOCABULARIES:
        raise bad(f"unknown vocabulary '{spec.vocab}' (choose from {', '.join(VOCABULARIES)})")
    for f in fields(spec):
        v = getattr(spec, f.name)
        if isinstance(v, int) and not isinstance(v, bool) and f.name not in ("seed",) and v <= 0:
            raise bad(f"{f.name} must be positive, got {v}")
    if spec.seed < 0:
        raise bad("seed must be non-negative")
    if spec.n_head % spec.n_head_kv:
        raise bad(f"n_head {spec.n_head} is not a multiple of n_head_kv {spec.n_head_kv}")
    if spec.ssm_v_heads % spec.ssm_k_heads:
        raise bad(f"ssm_v_heads {spec.ssm_v_heads} is not a multiple of ssm_k_heads {spec.ssm_k_heads}")
    if spec.rope_dim % 2 or spec.rope_dim > spec.head_dim:
        raise bad(f"rope_dim {spec.rope_dim} must be even and at most head_dim {spec.head_dim}")
    if spec.n_expert_used > spec.n_expert:
        raise bad(f"n_expert_used {spec.n_expert_used} exceeds n_expert {spec.n_expert}")
    if spec.conv_kernel < 2:
        raise bad("conv_kernel must be at least 2")
    if not 0.0 < spec.threshold <= 1.0:
        raise bad(f"threshold {spec.threshold} must be in (0, 1]")


def build_spec(
    preset: str = "tiny",
    *,
    quant: str | None = None,
    layers: int | None = None,
    vocab: str | None = None,
    arch: str | None = None,
    seed: int | None = None,
    **overrides: Any,
) -> SynthSpec:
    """A spec from command-line style choices: a preset plus the options the user gave (None = preset's)."""
    given: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
    named = (("quant", quant), ("n_layer", layers), ("vocab", vocab), ("arch", arch), ("seed", seed))
    for key, value in named:
        if value is not None:
            given[key] = value
    if "quant" in given:
        given["quant"] = normalize_quant(given["quant"])
    if "vocab" in given:
        given["vocab"] = str(given["vocab"]).strip().lower()
        if given["vocab"] not in VOCABULARIES:
            raise CloverError(f"unknown vocabulary '{vocab}' (choose from {', '.join(VOCABULARIES)})")
    return SynthSpec.preset(preset, **given)
