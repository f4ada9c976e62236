"""Preflight of a multi-node instance (pipeline group), before anything starts.

Every member reports what it will run; rank 0's values are the reference, and every
difference is named with the node and both values. Then the shape: PP x TP must equal
the GPUs the members use, and the model's layers must split over PP stages the way
vLLM splits them. Pure data in, messages out (empty: the group can start).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# What must be the same on every member, with the words the messages use.
SAME = {
    "engine_version": "engine version",
    "runtime": "engine runtime",
    "manifest_digest": "model manifest digest",
    "tensor_parallel_size": "tensor parallel size",
    "pipeline_parallel_size": "pipeline parallel size",
    "backend": "group backend",
    "master_port": "master port",
    "max_model_len": "max model length",
    "dtype": "dtype",
    "quantization": "quantization",
    "kv_cache_dtype": "KV cache dtype",
    "layer_partition": "VLLM_PP_LAYER_PARTITION",
    "extra_args": "extra engine arguments",
}


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def layer_split(layers: int, pp: int, partition: str = "") -> list[str]:
    """Problems splitting `layers` over `pp` stages (vLLM gives each stage at least one
    layer; VLLM_PP_LAYER_PARTITION, when set, must name one count per stage summing to
    the model's layers)."""
    if partition:
        try:
            counts = [int(part) for part in str(partition).split(",")]
        except ValueError:
            return [f"VLLM_PP_LAYER_PARTITION {partition!r} must be comma-separated layer counts"]
        if len(counts) != pp:
            return [f"VLLM_PP_LAYER_PARTITION {partition!r} names {len(counts)} stages, "
                    f"the pipeline parallel size is {pp}"]
        if sum(counts) != layers or min(counts) < 1:
            return [f"VLLM_PP_LAYER_PARTITION {partition!r} must give every stage at least "
                    f"one layer and sum to the model's {layers} layers (sums to {sum(counts)})"]
        return []
    if layers < pp:
        return [f"the model has {layers} layers, fewer than the pipeline parallel size {pp}: "
                "every stage needs at least one; lower inference_engine_pipeline_parallel_size"]
    return []


def group_problems(instance: str, members: Sequence[Mapping[str, Any]]) -> list[str]:
    """Messages naming the node and what differs or does not fit; [] when the group is sound.

    Each member: host, rank, and the keys of SAME, plus gpus (devices it uses),
    gpu_count (devices it has; None = unknown), layers (num_hidden_layers; None = unknown).
    """
    if len(members) < 2:
        return []
    members = sorted(members, key=lambda m: int(m["rank"]))
    ref = members[0]
    out = []
    for member in members[1:]:
        for key, words in SAME.items():
            if member.get(key) != ref.get(key):
                out.append(f"instance {instance}: {member['host']} has {words} "
                           f"{member.get(key)!r}, rank 0 ({ref['host']}) has {ref.get(key)!r}")
    if out:
        return out  # the shape checks below assume one set of settings
    tp = _int(ref.get("tensor_parallel_size")) or 1
    pp = _int(ref.get("pipeline_parallel_size")) or 1
    used = [(m["host"], _int(m.get("gpus")) or 1) for m in members]
    total = sum(n for _, n in used)
    if tp * pp != total:
        per_node = ", ".join(f"{h} {n}" for h, n in used)
        out.append(f"instance {instance}: pipeline parallel size {pp} x tensor parallel size {tp}"
                   f" = {tp * pp}, but its {len(members)} nodes use {total} devices ({per_node}):"
                   f" set inference_engine_pipeline_parallel_size to {len(members)} and"
                   " inference_engine_tensor_parallel_size to the devices per node")
    if pp % len(members):
        out.append(f"instance {instance}: pipeline parallel size {pp} does not split over its "
                   f"{len(members)} nodes: make it a multiple of {len(members)}")
    for member in members:
        has, uses = _int(member.get("gpu_count")), _int(member.get("gpus")) or 1
        if has is not None and uses > has:
            out.append(f"instance {instance}: {member['host']} would use {uses} GPUs "
                       f"but has {has}")
    layers = _int(ref.get("layers"))
    if layers is not None:
        out += [f"instance {instance}: {p}"
                for p in layer_split(layers, pp, ref.get("layer_partition") or "")]
    return out
