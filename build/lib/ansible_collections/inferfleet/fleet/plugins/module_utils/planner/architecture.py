"""The shape of a model, read from its Hugging Face ``config.json``.

Covered: decoder-only transformers with full attention, grouped-query attention,
per-layer sliding windows (Mistral, Qwen2, Gemma 2/3 style), DeepSeek's multi-head
latent attention (MLA) and mixture-of-experts MLPs (Mixtral, Qwen MoE, DeepSeek
MoE with shared experts). Models whose layers keep a state other than an
attention KV cache (Mamba, linear attention, chunked-local attention, sparse
indexers) are refused with a message, because their cache is sized differently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.errors import PlannerError

_ATTENTION_LAYER_TYPES = {"full_attention", "sliding_attention"}

# Model types whose KV cache is not (only) an attention cache; see the module
# docstring. The list is not exhaustive: unknown layer types are refused too.
_UNCOVERED_MODEL_TYPES = {
    "mamba": "a state-space model",
    "mamba2": "a state-space model",
    "jamba": "a hybrid of attention and Mamba layers",
    "falcon_h1": "a hybrid of attention and Mamba layers",
    "nemotron_h": "a hybrid of attention and Mamba layers",
    "qwen3_next": "a hybrid of attention and linear-attention layers",
    "deepseek_v32": "MLA plus a sparse-attention indexer cache",
    "deepseek_v4": "compressed sparse MLA",
    "llama4": "chunked-local attention layers",
}

# Model types whose attention normalises q and k per head (two head_dim vectors
# per layer), which matters only for the parameter count.
_QK_NORM_MODEL_TYPES = {"qwen3", "qwen3_moe", "olmo2", "olmoe"}

_TORCH_DTYPES = {"bfloat16", "float16", "float32"}


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention sizes (DeepSeek V2/V3, Kimi K2)."""

    kv_lora_rank: int
    q_lora_rank: int | None
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class MoE:
    """Mixture-of-experts sizes; ``moe_layers[i]`` says whether layer i is sparse."""

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    shared_intermediate_size: int
    shared_expert_gate: bool
    router_bias: bool
    moe_layers: tuple[bool, ...]


@dataclass(frozen=True)
class Architecture:
    """What the planner needs to know about a model, and nothing else."""

    model_type: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    torch_dtype: str
    attention_bias: bool
    qk_norm: bool
    layer_windows: tuple[int | None, ...]
    mla: MLA | None = None
    moe: MoE | None = None
    quantization_config: dict[str, Any] | None = None

    @property
    def has_sliding_window(self) -> bool:
        return any(w is not None for w in self.layer_windows)


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """Multimodal configs keep the language model under ``text_config``."""
    text = config.get("text_config")
    if isinstance(text, dict):
        merged = dict(text)
        for key in ("quantization_config", "torch_dtype", "dtype", "tie_word_embeddings"):
            if key in config and key not in merged:
                merged[key] = config[key]
        return merged
    return config


def _require_int(config: dict[str, Any], *names: str) -> int:
    for name in names:
        value = config.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    raise PlannerError(
        f"config.json has no integer {' / '.join(names)}; the planner needs it to size "
        "the model. Is this a decoder-only language model's config.json?"
    )


def _layer_windows(config: dict[str, Any], num_layers: int) -> tuple[int | None, ...]:
    """Per-layer sliding window, the way vLLM and transformers derive it.

    Order of precedence (vLLM's ``EngineArgs.create_engine_config`` and the
    attention layers of its model files): an explicit ``layer_types`` list; Qwen2's
    ``use_sliding_window`` + ``max_window_layers``; Gemma 3's
    ``sliding_window_pattern``; Gemma 2's alternation; otherwise a model-wide
    ``sliding_window`` applies to every layer (Mistral 7B v0.1).
    """
    window = config.get("sliding_window")
    if isinstance(window, list):  # Mistral-format list: one window per layer
        return tuple((w if w and w > 0 else None) for w in _stretch(window, num_layers))
    if not isinstance(window, int) or window <= 0:
        window = None

    layer_types = config.get("layer_types")
    if isinstance(layer_types, list):
        unknown = sorted(set(layer_types) - _ATTENTION_LAYER_TYPES)
        if unknown:
            raise PlannerError(
                f"layer type(s) {', '.join(unknown)} are not covered by the planner "
                "(it sizes attention KV caches only: full and sliding-window layers)."
            )
        if len(layer_types) < num_layers:
            raise PlannerError(
                f"config.json lists {len(layer_types)} layer_types for {num_layers} layers."
            )
        return tuple(
            window if kind == "sliding_attention" else None
            for kind in layer_types[:num_layers]
        )
    if window is None:
        return (None,) * num_layers
    if "use_sliding_window" in config:
        if not config["use_sliding_window"]:
            return (None,) * num_layers
        first = int(config.get("max_window_layers") or 0)
        return tuple(window if i >= first else None for i in range(num_layers))
    pattern = config.get("sliding_window_pattern")
    if isinstance(pattern, int) and pattern > 0:
        return tuple(None if (i + 1) % pattern == 0 else window for i in range(num_layers))
    if config.get("model_type") == "gemma2":
        return tuple(window if i % 2 == 0 else None for i in range(num_layers))
    return (window,) * num_layers


def _stretch(values: list[Any], n: int) -> list[Any]:
    """Repeat a per-layer pattern list to n layers."""
    return [values[i % len(values)] for i in range(n)]


def _moe(config: dict[str, Any], num_layers: int) -> MoE | None:
    experts_per_token = int(config.get("num_experts_per_tok") or 0)
    if config.get("n_routed_experts"):  # DeepSeek V2/V3, Kimi K2
        first_dense = int(config.get("first_k_dense_replace") or 0)
        freq = int(config.get("moe_layer_freq") or 1)
        layers = tuple(i >= first_dense and i % freq == 0 for i in range(num_layers))
        expert_size = _require_int(config, "moe_intermediate_size")
        return MoE(
            num_experts=int(config["n_routed_experts"]),
            experts_per_token=experts_per_token,
            expert_intermediate_size=expert_size,
            shared_intermediate_size=int(config.get("n_shared_experts") or 0) * expert_size,
            shared_expert_gate=False,
            router_bias=config.get("topk_method") == "noaux_tc",
            moe_layers=layers,
        )
    if config.get("num_experts"):  # Qwen2-MoE, Qwen3-MoE
        step = int(config.get("decoder_sparse_step") or 1)
        dense = set(config.get("mlp_only_layers") or [])
        layers = tuple(
            i not in dense and (i + 1) % step == 0 for i in range(num_layers)
        )
        shared = int(config.get("shared_expert_intermediate_size") or 0)
        return MoE(
            num_experts=int(config["num_experts"]),
            experts_per_token=experts_per_token,
            expert_intermediate_size=_require_int(
                config, "moe_intermediate_size", "intermediate_size"
            ),
            shared_intermediate_size=shared,
            shared_expert_gate=shared > 0,
            router_bias=False,
            moe_layers=layers,
        )
    if config.get("num_local_experts"):  # Mixtral
        return MoE(
            num_experts=int(config["num_local_experts"]),
            experts_per_token=experts_per_token,
            expert_intermediate_size=_require_int(config, "intermediate_size"),
            shared_intermediate_size=0,
            shared_expert_gate=False,
            router_bias=False,
            moe_layers=(True,) * num_layers,
        )
    return None


def _mla(config: dict[str, Any]) -> MLA | None:
    if not config.get("kv_lora_rank"):
        return None
    return MLA(
        kv_lora_rank=int(config["kv_lora_rank"]),
        q_lora_rank=int(config["q_lora_rank"]) if config.get("q_lora_rank") else None,
        qk_rope_head_dim=_require_int(config, "qk_rope_head_dim"),
        qk_nope_head_dim=_require_int(config, "qk_nope_head_dim"),
        v_head_dim=_require_int(config, "v_head_dim"),
    )


def _torch_dtype(config: dict[str, Any]) -> str:
    value = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    value = str(value).removeprefix("torch.")
    if value not in _TORCH_DTYPES:
        raise PlannerError(
            f"config.json says torch_dtype {value!r}; expected one of "
            f"{', '.join(sorted(_TORCH_DTYPES))}."
        )
    return value


def parse_architecture(config: dict[str, Any]) -> Architecture:
    """Read an :class:`Architecture` from a parsed ``config.json``."""
    if not isinstance(config, dict):
        raise PlannerError("config.json does not hold a JSON object.")
    text = _text_config(config)
    model_type = str(text.get("model_type") or config.get("model_type") or "unknown")
    if model_type in _UNCOVERED_MODEL_TYPES:
        raise PlannerError(
            f"model_type {model_type!r} is {_UNCOVERED_MODEL_TYPES[model_type]}; the "
            "planner covers attention-only decoders (dense, MoE, MLA, sliding window)."
        )
    num_layers = _require_int(text, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _require_int(text, "hidden_size", "n_embd", "d_model")
    heads = _require_int(text, "num_attention_heads", "n_head")
    kv_heads = text.get("num_key_value_heads")
    if not isinstance(kv_heads, int) or kv_heads <= 0:
        kv_heads = heads
    head_dim = text.get("head_dim")
    if not isinstance(head_dim, int) or head_dim <= 0:
        if hidden % heads:
            raise PlannerError(
                f"hidden_size {hidden} is not a multiple of num_attention_heads {heads} "
                "and config.json gives no head_dim."
            )
        head_dim = hidden // heads
    moe = _moe(text, num_layers)
    intermediate = text.get("intermediate_size")
    if not isinstance(intermediate, int):
        if moe is None:
            raise PlannerError("config.json has no intermediate_size for the MLP.")
        intermediate = 0
    max_pos = text.get("max_position_embeddings") or text.get("n_positions")
    if not isinstance(max_pos, int) or max_pos <= 0:
        raise PlannerError(
            "config.json has no max_position_embeddings; pass the context length "
            "explicitly."
        )
    tie = text.get("tie_word_embeddings")
    quant = config.get("quantization_config") or text.get("quantization_config")
    return Architecture(
        model_type=model_type,
        hidden_size=hidden,
        num_layers=num_layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=_require_int(text, "vocab_size"),
        intermediate_size=intermediate,
        # transformers' own default differs per family; absent means untied except
        # for Gemma, and untied is the larger (conservative) count anyway.
        tie_word_embeddings=bool(tie) if tie is not None else model_type.startswith("gemma"),
        max_position_embeddings=max_pos,
        torch_dtype=_torch_dtype(text),
        attention_bias=bool(text.get("attention_bias"))
        or model_type in {"qwen2", "qwen2_moe"},
        qk_norm=model_type in _QK_NORM_MODEL_TYPES,
        layer_windows=_layer_windows(text, num_layers),
        mla=_mla(text),
        moe=moe,
        quantization_config=quant if isinstance(quant, dict) else None,
    )
