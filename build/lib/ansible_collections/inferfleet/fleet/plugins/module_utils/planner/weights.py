"""Weight bytes: exact from safetensors headers, or estimated from config.json.

Two sources, one inventory of tensors:

* **checkpoint**: every tensor from the safetensors headers, at its stored size.
  Unquantized floating-point tensors are counted at the dtype vLLM loads them in
  (``--dtype``; ``auto`` is the config's dtype, float32 becoming bfloat16 as
  vLLM's ``_resolve_auto_dtype`` does). Tensors of layers past
  ``num_hidden_layers`` (DeepSeek's multi-token-prediction layer) are skipped:
  vLLM loads them only for speculative decoding.
* **estimate**: the tensors a Hugging Face checkpoint of this config holds, built
  from the config (embeddings, attention or MLA projections, dense or MoE MLP,
  norms, lm_head unless tied). The parameter count matches the published one for
  Llama, Mistral, Qwen and DeepSeek models (see tests/unit/test_planner.py).

Quantization (a pre-quantized checkpoint's ``quantization_config``, or the
``--quantization`` asked for) applies to the linear layers inside the decoder
layers only: embeddings, lm_head, norms and MoE routers stay in the model dtype,
as in every format below. Bytes per quantized weight of shape [out, in]:

=========  ===================================================================
fp8        1 byte/param + fp32 scale per 128x128 block (``weight_block_size``,
           DeepSeek V3 / Qwen3-FP8), or one fp32 scale per tensor (vLLM's
           online ``--quantization fp8``)
int8       1 byte/param + fp32 scale per output channel (W8A8)
int4       0.5 byte/param + per group of ``group_size`` inputs (default 128) an
           fp16 scale and a 4-bit zero point: (2 + 0.5) bytes (AWQ, GPTQ,
           compressed-tensors W4A16)
nvfp4      0.5 byte/param + fp8 scale per 16 params + 2 fp32 global scales
           (NVIDIA ModelOpt / compressed-tensors NVFP4)
mxfp4      0.5 byte/param + e8m0 scale per 32 params (OCP MX, gpt-oss)
=========  ===================================================================

Under tensor parallel T, vLLM shards embeddings, lm_head and the linear layers
T ways; norms and routers are replicated; k/v projections are replicated once T
exceeds the KV heads (each rank keeps at least one KV head), and MLA's
``q_a_proj`` / ``kv_a_proj_with_mqa`` are replicated linears. Under pipeline
parallel P, the layers are split the way vLLM's ``get_pp_indices`` splits them
(remainder to the middle stages), the embedding on the first stage, the final
norm and lm_head on the last.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.architecture import (
    Architecture,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.errors import PlannerError
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.model import TensorInfo

DTYPE_BY_NAME = {"bfloat16": ("BF16", 2), "float16": ("F16", 2), "float32": ("F32", 4)}
_DTYPE_ALIASES = {"auto": "auto", "half": "float16", "float": "float32", "bf16": "bfloat16",
                  "fp16": "float16", "fp32": "float32"}
_FLOAT_CODES = {"BF16", "F16", "F32"}
_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)\.")
_OTHER_MARKERS = ("vision", "visual", "multi_modal_projector", "mm_projector", "audio")


@dataclass(frozen=True)
class QuantScheme:
    """How the linear layers are stored; see the module docstring."""

    name: str = "none"
    block: tuple[int, int] | None = None
    group_size: int = 128

    def linear_bytes(self, shape: tuple[int, ...], unquantized_bytes: int) -> int:
        """Bytes of one linear weight of ``shape`` (leading dims: stacked experts)."""
        numel = math.prod(shape)
        if self.name == "none" or len(shape) < 2:
            return numel * unquantized_bytes
        lead = math.prod(shape[:-2])
        out_dim, in_dim = shape[-2], shape[-1]
        if self.name == "fp8":
            if self.block:
                blocks = math.ceil(out_dim / self.block[0]) * math.ceil(in_dim / self.block[1])
                return numel + 4 * lead * blocks
            return numel + 4 * lead
        if self.name == "int8":
            return numel + 4 * lead * out_dim
        if self.name == "int4":
            groups = math.ceil(in_dim / self.group_size)
            return math.ceil(numel / 2) + math.ceil(lead * out_dim * groups * 2.5)
        if self.name == "nvfp4":
            return math.ceil(numel / 2) + math.ceil(numel / 16) + 8 * lead
        if self.name == "mxfp4":
            return math.ceil(numel / 2) + math.ceil(numel / 32)
        raise PlannerError(f"unknown quantization scheme {self.name!r}.")

    def describe(self) -> str:
        if self.name == "fp8" and self.block:
            return f"fp8 (block {self.block[0]}x{self.block[1]})"
        if self.name == "int4":
            return f"int4 (group {self.group_size})"
        return self.name


#: Names accepted by ``--quantization``, mapped to a scheme. vLLM's own method
#: names are accepted too.
QUANTIZATION_NAMES: dict[str, QuantScheme] = {
    "none": QuantScheme("none"),
    "fp8": QuantScheme("fp8"),
    "int8": QuantScheme("int8"),
    "w8a8": QuantScheme("int8"),
    "int4": QuantScheme("int4"),
    "awq": QuantScheme("int4"),
    "gptq": QuantScheme("int4"),
    "nvfp4": QuantScheme("nvfp4"),
    "modelopt_fp4": QuantScheme("nvfp4"),
    "mxfp4": QuantScheme("mxfp4"),
}

#: Lower-precision options to suggest, in order of preference.
PRECISION_LADDER = ("fp8", "int4")


def scheme_from_name(name: str) -> QuantScheme:
    key = name.strip().lower()
    if key not in QUANTIZATION_NAMES:
        raise PlannerError(
            f"--quantization {name!r} is not known; use one of "
            f"{', '.join(sorted(QUANTIZATION_NAMES))}."
        )
    return QUANTIZATION_NAMES[key]


def _compressed_tensors_scheme(config: dict[str, Any]) -> QuantScheme:
    for group in (config.get("config_groups") or {}).values():
        weights = group.get("weights") or {}
        bits = int(weights.get("num_bits") or 0)
        kind = weights.get("type", "int")
        group_size = int(weights.get("group_size") or 0)
        if bits == 8 and kind == "float":
            block = weights.get("block_structure")
            return QuantScheme("fp8", tuple(block) if block else None)
        if bits == 8:
            return QuantScheme("int8")
        if bits == 4 and kind == "float":
            return QuantScheme("nvfp4" if group_size in (0, 16) else "mxfp4")
        if bits == 4:
            return QuantScheme("int4", group_size=group_size if group_size > 0 else 128)
    raise PlannerError(
        "compressed-tensors quantization_config has no config_groups weights the "
        "planner knows (8-bit int/float, 4-bit int/float)."
    )


def scheme_from_config(quant: dict[str, Any] | None) -> QuantScheme:
    """The scheme of a pre-quantized checkpoint, from its ``quantization_config``."""
    if not quant:
        return QuantScheme("none")
    method = str(quant.get("quant_method") or "").lower()
    if method == "fp8":
        block = quant.get("weight_block_size")
        return QuantScheme("fp8", (int(block[0]), int(block[1])) if block else None)
    if method in {"awq", "gptq", "awq_marlin", "gptq_marlin"}:
        bits = int(quant.get("bits") or quant.get("w_bit") or 4)
        group = int(quant.get("group_size") or quant.get("q_group_size") or 128)
        if bits == 8:
            return QuantScheme("int8")
        if bits != 4:
            raise PlannerError(f"{method} with {bits}-bit weights is not covered.")
        return QuantScheme("int4", group_size=group if group > 0 else 1 << 30)
    if method == "compressed-tensors":
        return _compressed_tensors_scheme(quant)
    if method in {"modelopt", "modelopt_fp4"}:
        algo = str(quant.get("quant_algo") or "").upper()
        return QuantScheme("nvfp4") if "FP4" in algo or method == "modelopt_fp4" else (
            QuantScheme("fp8"))
    if method == "mxfp4":
        return QuantScheme("mxfp4")
    if method == "bitsandbytes":
        return QuantScheme("int4", group_size=64)
    raise PlannerError(
        f"quantization_config.quant_method {method!r} is not covered by the planner "
        "(covered: fp8, awq, gptq, compressed-tensors, modelopt, mxfp4, bitsandbytes)."
    )


def resolve_dtype(requested: str, arch: Architecture) -> str:
    """vLLM's ``--dtype``: ``auto`` is the config dtype, float32 downcast to bfloat16."""
    name = _DTYPE_ALIASES.get(requested.lower(), requested.lower())
    if name == "auto":
        return "bfloat16" if arch.torch_dtype == "float32" else arch.torch_dtype
    if name not in DTYPE_BY_NAME:
        raise PlannerError(
            f"--dtype {requested!r} is not known; use auto, bfloat16, float16 or float32."
        )
    return name


def layer_index(name: str) -> int | None:
    match = _LAYER_RE.search(name)
    return int(match.group(1)) if match else None


def tensor_role(name: str) -> str:
    """embedding, lm_head, norm, router, expert, linear or other."""
    if any(marker in name for marker in _OTHER_MARKERS):
        return "other"
    if "embed_tokens" in name or ".wte." in name or "word_embeddings" in name:
        return "embedding"
    if name.startswith("lm_head") or ".lm_head." in name:
        return "lm_head"
    parts = name.split(".")
    module = parts[-2] if len(parts) > 1 else parts[-1]
    if "norm" in module or module.startswith("ln"):
        return "norm"
    if ".experts." in name or name.endswith(".experts") or module == "experts":
        return "expert"
    if module in {"gate", "router", "shared_expert_gate"}:
        return "router"
    if layer_index(name) is not None:
        return "linear"
    return "other"


def _tp_kind(name: str, role: str) -> str:
    """split (sharded T ways), kv (sharded over at most the KV heads) or replicated."""
    if role in {"norm", "router", "other"}:
        return "replicated"
    module = name.split(".")[-2] if "." in name else name
    if module in {"k_proj", "v_proj"}:
        return "kv"
    if module in {"q_a_proj", "kv_a_proj_with_mqa", "fused_qkv_a_proj"}:
        return "replicated"
    return "split"


@dataclass(frozen=True)
class _Entry:
    layer: int | None
    role: str
    tp: str
    nbytes: int


@dataclass(frozen=True)
class Weights:
    """Loaded weight bytes of a model, ready to split over TP x PP."""

    source: str  # "checkpoint" or "estimate"
    scheme: QuantScheme
    dtype: str
    num_layers: int
    num_kv_heads: int
    entries: tuple[_Entry, ...] = field(repr=False)
    parameters: int  # elements stored (the parameter count when unquantized)
    skipped_bytes: int = 0
    notes: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    def stage_gpu_bytes(self, tp: int, pp: int) -> list[int]:
        """Weight bytes on one GPU of each pipeline stage."""
        ranges = pp_layer_ranges(self.num_layers, pp)
        stage_of_layer = {}
        for stage, (start, end) in enumerate(ranges):
            for layer in range(start, end):
                stage_of_layer[layer] = stage
        per_stage = [0.0] * pp
        kv_div = min(tp, self.num_kv_heads)
        for e in self.entries:
            if e.layer is not None:
                stage = stage_of_layer[e.layer]
            elif e.role in {"lm_head", "norm"}:
                stage = pp - 1
            else:
                stage = 0
            divisor = {"split": tp, "kv": kv_div, "replicated": 1}[e.tp]
            per_stage[stage] += e.nbytes / divisor
        return [math.ceil(b) for b in per_stage]


def pp_layer_ranges(num_layers: int, pp: int) -> list[tuple[int, int]]:
    """[start, end) layers per stage, as vLLM's ``get_pp_indices`` splits them."""
    if pp < 1 or pp > num_layers:
        raise PlannerError(f"pipeline size {pp} needs 1..{num_layers} stages for this model.")
    sizes = [num_layers // pp] * pp
    remaining = num_layers % pp
    for i in range(2, remaining + 2):
        sizes[-i] += 1
    ranges, start = [], 0
    for size in sizes:
        ranges.append((start, start + size))
        start += size
    return ranges


def estimate_tensors(arch: Architecture, dtype: str | None = None) -> list[TensorInfo]:
    """The tensors of a Hugging Face checkpoint with this config, unquantized."""
    code, size = DTYPE_BY_NAME[dtype or resolve_dtype("auto", arch)]
    tensors: list[TensorInfo] = []

    def add(name: str, *shape: int) -> None:
        tensors.append(TensorInfo(name, code, tuple(shape), math.prod(shape) * size))

    h, v = arch.hidden_size, arch.vocab_size
    add("model.embed_tokens.weight", v, h)
    for i in range(arch.num_layers):
        p = f"model.layers.{i}."
        add(p + "input_layernorm.weight", h)
        add(p + "post_attention_layernorm.weight", h)
        if arch.mla:
            m, heads = arch.mla, arch.num_attention_heads
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            if m.q_lora_rank:
                add(p + "self_attn.q_a_proj.weight", m.q_lora_rank, h)
                add(p + "self_attn.q_a_layernorm.weight", m.q_lora_rank)
                add(p + "self_attn.q_b_proj.weight", heads * qk, m.q_lora_rank)
            else:
                add(p + "self_attn.q_proj.weight", heads * qk, h)
            add(p + "self_attn.kv_a_proj_with_mqa.weight", m.kv_lora_rank + m.qk_rope_head_dim, h)
            add(p + "self_attn.kv_a_layernorm.weight", m.kv_lora_rank)
            add(p + "self_attn.kv_b_proj.weight",
                heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank)
            add(p + "self_attn.o_proj.weight", h, heads * m.v_head_dim)
        else:
            q_out = arch.num_attention_heads * arch.head_dim
            kv_out = arch.num_kv_heads * arch.head_dim
            add(p + "self_attn.q_proj.weight", q_out, h)
            add(p + "self_attn.k_proj.weight", kv_out, h)
            add(p + "self_attn.v_proj.weight", kv_out, h)
            add(p + "self_attn.o_proj.weight", h, q_out)
            if arch.attention_bias:
                add(p + "self_attn.q_proj.bias", q_out)
                add(p + "self_attn.k_proj.bias", kv_out)
                add(p + "self_attn.v_proj.bias", kv_out)
            if arch.qk_norm:
                add(p + "self_attn.q_norm.weight", arch.head_dim)
                add(p + "self_attn.k_norm.weight", arch.head_dim)
        moe = arch.moe
        if moe and moe.moe_layers[i]:
            e, mi = moe.num_experts, moe.expert_intermediate_size
            add(p + "mlp.gate.weight", e, h)
            if moe.router_bias:
                add(p + "mlp.gate.e_score_correction_bias", e)
            add(p + "mlp.experts.gate_proj.weight", e, mi, h)
            add(p + "mlp.experts.up_proj.weight", e, mi, h)
            add(p + "mlp.experts.down_proj.weight", e, h, mi)
            if moe.shared_intermediate_size:
                si = moe.shared_intermediate_size
                add(p + "mlp.shared_experts.gate_proj.weight", si, h)
                add(p + "mlp.shared_experts.up_proj.weight", si, h)
                add(p + "mlp.shared_experts.down_proj.weight", h, si)
            if moe.shared_expert_gate:
                add(p + "mlp.shared_expert_gate.weight", 1, h)
        else:
            add(p + "mlp.gate_proj.weight", arch.intermediate_size, h)
            add(p + "mlp.up_proj.weight", arch.intermediate_size, h)
            add(p + "mlp.down_proj.weight", h, arch.intermediate_size)
    add("model.norm.weight", h)
    if not arch.tie_word_embeddings:
        add("lm_head.weight", v, h)
    return tensors


def _quantizable(role: str, shape: tuple[int, ...]) -> bool:
    return role in {"linear", "expert"} and len(shape) >= 2


def build_weights(
    arch: Architecture,
    tensors: tuple[TensorInfo, ...] | None,
    dtype: str = "auto",
    quantization: str | None = None,
) -> Weights:
    """Loaded weight bytes for ``--dtype`` and ``--quantization``.

    ``tensors`` are the checkpoint's (from headers) or None to estimate from the
    config. See the module docstring for the rules.
    """
    target = resolve_dtype(dtype, arch)
    target_bytes = DTYPE_BY_NAME[target][1]
    checkpoint_scheme = scheme_from_config(arch.quantization_config)
    notes: list[str] = []
    if quantization in (None, "", "auto"):
        scheme = checkpoint_scheme
    else:
        scheme = scheme_from_name(quantization)
        if checkpoint_scheme.name == scheme.name:
            scheme = checkpoint_scheme  # keep the checkpoint's block/group sizes
    source = "checkpoint" if tensors is not None else "estimate"
    requantize = tensors is None or (
        checkpoint_scheme.name == "none" and scheme.name != "none"
    )
    if tensors is not None and checkpoint_scheme.name != "none":
        if scheme.name != checkpoint_scheme.name:
            raise PlannerError(
                f"this checkpoint is already quantized ({checkpoint_scheme.describe()}); "
                f"vLLM cannot load it as {scheme.name}. Plan with its config.json alone "
                "to see what another format would need, or use a checkpoint in that format."
            )
    if tensors is not None and requantize:
        source = "checkpoint shapes"
        if scheme.name != "fp8":
            notes.append(
                f"{scheme.name} needs a pre-quantized checkpoint; sizes are estimated from "
                "this checkpoint's shapes (vLLM quantizes online to fp8 only)."
            )
    if tensors is None:
        tensors = tuple(estimate_tensors(arch, target))
        notes.append("weights estimated from config.json (no safetensors headers read).")

    sums: dict[tuple[int | None, str, str], int] = {}
    parameters = 0
    skipped = 0
    for t in tensors:
        layer = layer_index(t.name)
        if (layer is not None and layer >= arch.num_layers) or "rotary_emb.inv_freq" in t.name:
            skipped += t.nbytes
            continue
        role = tensor_role(t.name)
        if requantize and _quantizable(role, t.shape):
            nbytes = scheme.linear_bytes(t.shape, target_bytes)
        elif t.dtype in _FLOAT_CODES and checkpoint_scheme.name == "none":
            nbytes = t.numel * target_bytes
        else:
            nbytes = t.nbytes
        parameters += t.numel
        key = (layer, role, _tp_kind(t.name, role))
        sums[key] = sums.get(key, 0) + nbytes  # one entry per layer/role: fast to split
    if skipped:
        notes.append(
            f"skipped {skipped / 2**30:.2f} GiB of tensors vLLM does not load "
            "(layers past num_hidden_layers, e.g. multi-token prediction)."
        )
    return Weights(
        source=source,
        scheme=scheme,
        dtype=target,
        num_layers=arch.num_layers,
        num_kv_heads=arch.num_kv_heads,
        entries=tuple(_Entry(layer, role, tp, n) for (layer, role, tp), n in sums.items()),
        parameters=parameters,
        skipped_bytes=skipped,
        notes=tuple(notes),
    )
