"""The recommendation: replicated, pipeline, or "does not fit" with what to change.

A layout is TP x PP: PP nodes per instance, TP GPUs per node. It fits when, on
every GPU, ``memory x gpu_memory_utilization`` holds the weights, the overhead
(see module_utils.planner.memory`) and a KV cache big enough for the target
number of concurrent sequences at the target context (vLLM's own start-up check
is the same with one sequence).

Decision, following docs/DESIGN.md "The one idea: instances":

1. **replicated** when one node fits at TP = the node's GPUs (the largest TP the
   model allows, when the heads do not divide by the GPU count); every node is
   an instance. The smallest TP that would fit is reported too.
2. otherwise **pipeline** with the smallest PP (nodes per instance) that fits,
   TP = the node's GPUs; ``nodes // PP`` instances.
3. otherwise **does not fit**: the shortfall per GPU at the largest layout the
   fleet allows, and what would make it fit (lower precision, fp8 KV cache,
   shorter context, fewer sequences, more nodes).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.architecture import (
    Architecture,
    parse_architecture,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.errors import PlannerError
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.memory import (
    GPU_BLOCK_SIZE,
    GiB,
    KVCapacity,
    Overhead,
    engine_defaults,
    kv_bytes_per_token,
    kv_capacity,
    kv_dtype_bytes,
    layer_caches,
    overhead,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.model import ModelSource
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.network import (
    PipelineNetwork,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.weights import (
    DTYPE_BY_NAME,
    PRECISION_LADDER,
    Weights,
    build_weights,
    pp_layer_ranges,
)

#: The group_vars ``--write-vars`` emits, by meaning; the roles read these names.
GROUP_VAR_NAMES = {
    "topology": "inferfleet_topology",
    "nodes_per_instance": "inferfleet_nodes_per_instance",
    "tensor_parallel_size": "inference_engine_tensor_parallel_size",
    "pipeline_parallel_size": "inference_engine_pipeline_parallel_size",
    "max_model_len": "inference_engine_max_model_len",
    "max_num_seqs": "inference_engine_max_num_seqs",
    "gpu_memory_utilization": "inference_engine_gpu_memory_utilization",
    "dtype": "inference_engine_dtype",
    "kv_cache_dtype": "inference_engine_kv_cache_dtype",
    "quantization": "inference_engine_quantization",
    # a pipeline's links, checked by the fabric preflight (module_utils.planner.network)
    "min_bandwidth_gbit": "fabric_preflight_min_bandwidth_gbit",
    "max_rtt_ms": "fabric_preflight_max_rtt_ms",
}

#: Conservative default: vLLM 0.32 defaults to 0.92 (0.90 before).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.90
#: Target time per output token: an interactive pace.
DEFAULT_TPOT_MS = 50.0


@dataclass(frozen=True)
class Hardware:
    """The GPUs of one node, and how many such nodes the fleet has."""

    gpus_per_node: int
    gpu_memory_gib: float
    nodes: int = 1

    def check(self) -> None:
        if self.gpus_per_node < 1:
            raise PlannerError("--gpus-per-node must be at least 1.")
        if not self.gpu_memory_gib > 0:
            raise PlannerError("--gpu-memory-gib must be more than 0.")
        if self.nodes < 1:
            raise PlannerError("--nodes must be at least 1.")


@dataclass(frozen=True)
class Targets:
    """What the fleet must serve, and the engine settings that shape memory."""

    context: int | None = None  # None: the model's max_position_embeddings
    concurrency: int | None = None  # None: 1 sequence for the check, engine default seqs
    dtype: str = "auto"
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    max_num_batched_tokens: int | None = None  # None: vLLM's default for the GPU size
    block_size: int = GPU_BLOCK_SIZE
    cuda_graphs: bool = True
    # What a pipeline's network must carry (module_utils.planner.network): tokens/s per
    # instance, None: every sequence decoding at the target pace, and as many prefilled.
    prefill_rate: float | None = None
    decode_rate: float | None = None
    tpot_ms: float = DEFAULT_TPOT_MS


@dataclass(frozen=True)
class Layout:
    """One TP x PP evaluated; the budget is the fullest GPU's."""

    tp: int
    pp: int
    fits: bool
    total_bytes: int
    usable_bytes: int
    weights_bytes: int
    overhead: Overhead
    kv_cache_bytes: int
    kv_needed_bytes: int
    shortfall_bytes: int
    capacity: KVCapacity
    kv_bytes_per_token: int
    stage_weights: tuple[int, ...] = ()
    stage_kv_cache: tuple[int, ...] = ()

    @property
    def free_bytes(self) -> int:
        return max(0, self.total_bytes - self.weights_bytes - self.overhead.total
                   - self.kv_cache_bytes)

    def summary(self) -> dict[str, Any]:
        return {
            "tensor_parallel_size": self.tp,
            "pipeline_parallel_size": self.pp,
            "fits": self.fits,
            "kv_cache_tokens": self.capacity.tokens,
            "max_concurrency": round(self.capacity.max_concurrency, 2),
            "shortfall_gib": round(self.shortfall_bytes / GiB, 2),
        }


@dataclass
class Plan:
    """The planner's answer; :meth:`to_dict` is the ``--json`` form."""

    location: str
    arch: Architecture
    weights: Weights
    hardware: Hardware
    targets: Targets
    context: int
    concurrency: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_dtype: str
    kv_bytes: int
    decision: str
    layout: Layout | None
    smallest_tp: int | None = None
    instances: int = 0
    nodes_per_instance: int = 0
    idle_nodes: int = 0
    shortfall_bytes: int = 0
    suggestions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    evaluated: list[Layout] = field(default_factory=list)
    network: PipelineNetwork | None = None  # a pipeline's demand on its links

    @property
    def fits(self) -> bool:
        return self.decision != "does_not_fit"

    def to_dict(self) -> dict[str, Any]:
        arch = self.arch
        layout = self.layout
        per_gpu = None
        if layout is not None:
            per_gpu = {
                "total_gib": _gib(layout.total_bytes),
                "usable_gib": _gib(layout.usable_bytes),
                "weights_gib": _gib(layout.weights_bytes),
                "overhead_gib": _gib(layout.overhead.total),
                "overhead": {k: _gib(v) for k, v in asdict(layout.overhead).items()},
                "kv_cache_gib": _gib(layout.kv_cache_bytes),
                "free_gib": _gib(layout.free_bytes),
            }
        return {
            "model": {
                "location": self.location,
                "model_type": arch.model_type,
                "layers": arch.num_layers,
                "hidden_size": arch.hidden_size,
                "attention": "mla" if arch.mla else "gqa",
                "kv_heads": 1 if arch.mla else arch.num_kv_heads,
                "head_dim": (arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim)
                if arch.mla else arch.head_dim,
                "sliding_window_layers": sum(w is not None for w in arch.layer_windows),
                "experts": arch.moe.num_experts if arch.moe else 0,
                "max_position_embeddings": arch.max_position_embeddings,
            },
            "weights": {
                "source": self.weights.source,
                "dtype": self.weights.dtype,
                "quantization": self.weights.scheme.describe(),
                "bytes": self.weights.total_bytes,
                "gib": _gib(self.weights.total_bytes),
                "parameters": self.weights.parameters,
            },
            "kv_cache": {
                "dtype": self.kv_dtype,
                "bytes_per_token": kv_bytes_per_token(arch, self.kv_bytes),
                "bytes_per_token_per_gpu": layout.kv_bytes_per_token if layout else None,
            },
            "hardware": asdict(self.hardware),
            "targets": {
                "context": self.context,
                "concurrency": self.concurrency,
                "max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "gpu_memory_utilization": self.targets.gpu_memory_utilization,
                "block_size": self.targets.block_size,
            },
            "decision": self.decision,
            "tensor_parallel_size": layout.tp if layout else None,
            "pipeline_parallel_size": layout.pp if layout else None,
            "smallest_tp": self.smallest_tp,
            "instances": self.instances,
            "nodes_per_instance": self.nodes_per_instance,
            "idle_nodes": self.idle_nodes,
            "per_gpu": per_gpu,
            "kv_capacity": {
                "tokens": layout.capacity.tokens,
                "blocks": layout.capacity.num_blocks,
                "max_concurrency": round(layout.capacity.max_concurrency, 2),
                "fleet_concurrency": math.floor(layout.capacity.max_concurrency)
                * self.instances,
            } if layout else None,
            "shortfall_gib": _gib(self.shortfall_bytes),
            "suggestions": list(self.suggestions),
            "notes": list(self.notes),
            "layouts": [candidate.summary() for candidate in self.evaluated],
            "group_vars": self.group_vars() if self.fits else None,
            "pipeline_network": self.network.to_dict() if self.network else None,
        }

    def group_vars(self) -> dict[str, Any]:
        """The variables the roles consume (names in :data:`GROUP_VAR_NAMES`)."""
        if self.layout is None or not self.fits:
            raise PlannerError("no layout fits, so there are no group_vars to write.")
        requested = self.targets.quantization
        values = {
            "topology": self.decision,
            "nodes_per_instance": self.nodes_per_instance,
            "tensor_parallel_size": self.layout.tp,
            "pipeline_parallel_size": self.layout.pp,
            "max_model_len": self.context,
            "max_num_seqs": self.max_num_seqs,
            "gpu_memory_utilization": self.targets.gpu_memory_utilization,
            "dtype": self.targets.dtype,
            "kv_cache_dtype": self.targets.kv_cache_dtype,
            "quantization": requested if requested not in (None, "", "auto", "none") else None,
        }
        if self.network is not None:
            need = self.network.to_dict()
            values["min_bandwidth_gbit"] = need["min_bandwidth_gbit_s"]
            values["max_rtt_ms"] = need["max_rtt_ms"]
        return {GROUP_VAR_NAMES[key]: value for key, value in values.items()}


def _gib(n: int | float) -> float:
    return round(n / GiB, 2)


def valid_tp_sizes(arch: Architecture, gpus: int) -> list[int]:
    """TP sizes vLLM accepts for this model, up to ``gpus``.

    vLLM needs the attention heads to divide by TP, and the KV heads to divide
    by TP or TP by the KV heads (MLA keeps one latent head, so only the first).
    """
    sizes = []
    for tp in range(1, gpus + 1):
        if arch.num_attention_heads % tp:
            continue
        kv = arch.num_kv_heads
        if not arch.mla and kv % tp and tp % kv:
            continue
        sizes.append(tp)
    return sizes


class _Evaluator:
    """Evaluates layouts for one model, hardware and target."""

    def __init__(self, arch: Architecture, weights: Weights, hardware: Hardware,
                 targets: Targets, context: int, concurrency: int, max_num_seqs: int,
                 max_num_batched_tokens: int, kv_bytes: int) -> None:
        self.arch = arch
        self.weights = weights
        self.hardware = hardware
        self.targets = targets
        self.context = context
        self.concurrency = concurrency
        self.max_num_seqs = max_num_seqs
        self.batched = max_num_batched_tokens
        self.kv_bytes = kv_bytes
        self.total = int(hardware.gpu_memory_gib * GiB)
        self.usable = int(self.total * targets.gpu_memory_utilization)

    def evaluate(self, tp: int, pp: int, context: int | None = None) -> Layout:
        context = context or self.context
        act_bytes = DTYPE_BY_NAME[self.weights.dtype][1]
        extra = overhead(self.arch, tp, pp, act_bytes, self.batched, self.max_num_seqs,
                         self.targets.cuda_graphs)
        caches = layer_caches(self.arch, self.kv_bytes, tp)
        stage_weights = self.weights.stage_gpu_bytes(tp, pp)
        stages = []
        for (start, end), weights in zip(pp_layer_ranges(self.arch.num_layers, pp),
                                         stage_weights, strict=True):
            available = self.usable - weights - extra.total
            capacity = kv_capacity(caches[start:end], available, self.targets.block_size,
                                   context, self.batched)
            stages.append((capacity, weights, caches[start:end]))
        # Every stage allocates the smallest stage's block count (vLLM takes the min).
        num_blocks = min(c.num_blocks for c, _, _ in stages)
        per_request = max(c.blocks_per_request for c, _, _ in stages)
        worst = min(stages, key=lambda s: (s[0].num_blocks, -s[1]))
        capacity = replace(worst[0], num_blocks=num_blocks, blocks_per_request=per_request)
        needed_blocks = math.ceil(self.concurrency * per_request)
        shortfall = max(
            weights + extra.total + needed_blocks * c.bytes_per_block - self.usable
            for c, weights, _ in stages
        )
        fits = num_blocks >= needed_blocks and num_blocks > 0
        return Layout(
            tp=tp,
            pp=pp,
            fits=fits,
            total_bytes=self.total,
            usable_bytes=self.usable,
            weights_bytes=worst[1],
            overhead=extra,
            kv_cache_bytes=num_blocks * worst[0].bytes_per_block,
            kv_needed_bytes=needed_blocks * worst[0].bytes_per_block,
            shortfall_bytes=0 if fits else max(0, shortfall),
            capacity=capacity,
            kv_bytes_per_token=sum(c.bytes_per_token for c in worst[2]),
            stage_weights=tuple(weights for _, weights, _ in stages),
            stage_kv_cache=tuple(num_blocks * c.bytes_per_block for c, _, _ in stages),
        )

    def longest_context(self, tp: int, pp: int) -> int:
        """The longest context at which this layout holds the target concurrency."""
        low, high = 0, self.context - 1
        while low < high:
            mid = (low + high + 1) // 2
            if self.evaluate(tp, pp, context=mid).fits:
                low = mid
            else:
                high = mid - 1
        return low


def _resolve(arch: Architecture, hardware: Hardware, targets: Targets
             ) -> tuple[int, int, int, int]:
    hardware.check()
    if not 0 < targets.gpu_memory_utilization <= 1:
        raise PlannerError("--gpu-memory-utilization must be in (0, 1], e.g. 0.9.")
    context = targets.context or arch.max_position_embeddings
    if context < 1:
        raise PlannerError("--context must be at least 1 token.")
    if context > arch.max_position_embeddings:
        raise PlannerError(
            f"--context {context} is longer than the model's max_position_embeddings "
            f"({arch.max_position_embeddings}); vLLM refuses that. Use at most "
            f"{arch.max_position_embeddings}."
        )
    if targets.concurrency is not None and targets.concurrency < 1:
        raise PlannerError("--concurrency must be at least 1.")
    if targets.block_size < 1:
        raise PlannerError("block size must be at least 1.")
    for flag, value in (("--prefill-rate", targets.prefill_rate),
                        ("--decode-rate", targets.decode_rate), ("--tpot-ms", targets.tpot_ms)):
        if value is not None and not value > 0:
            raise PlannerError(f"{flag} must be more than 0, not {value:g}.")
    default_batched, default_seqs = engine_defaults(hardware.gpu_memory_gib * GiB)
    concurrency = targets.concurrency or 1
    max_num_seqs = targets.concurrency or default_seqs
    batched = targets.max_num_batched_tokens or default_batched
    return context, concurrency, max_num_seqs, batched


def plan_model(source: ModelSource, hardware: Hardware, targets: Targets | None = None) -> Plan:
    """Plan a model read by module_utils.planner.model.load_model`."""
    targets = targets or Targets()
    arch = parse_architecture(source.config)
    weights = build_weights(arch, source.tensors, targets.dtype, targets.quantization)
    return _plan(source.location, arch, weights, hardware, targets, source.tensors)


def plan_config(config: dict[str, Any], hardware: Hardware, targets: Targets | None = None,
                location: str = "config.json") -> Plan:
    """Plan from a parsed config.json alone (weights estimated)."""
    return plan_model(ModelSource(location, config, None), hardware, targets)


def _plan(location: str, arch: Architecture, weights: Weights, hardware: Hardware,
          targets: Targets, tensors: Any) -> Plan:
    context, concurrency, max_num_seqs, batched = _resolve(arch, hardware, targets)
    kv_bytes = kv_dtype_bytes(targets.kv_cache_dtype, weights.dtype)
    kv_name = targets.kv_cache_dtype if targets.kv_cache_dtype != "auto" else weights.dtype
    ev = _Evaluator(arch, weights, hardware, targets, context, concurrency, max_num_seqs,
                    batched, kv_bytes)
    plan = Plan(
        location=location, arch=arch, weights=weights, hardware=hardware, targets=targets,
        context=context, concurrency=concurrency, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=batched, kv_dtype=kv_name, kv_bytes=kv_bytes,
        decision="does_not_fit", layout=None, notes=list(weights.notes),
    )
    tps = valid_tp_sizes(arch, hardware.gpus_per_node)
    if not tps:
        raise PlannerError("no tensor-parallel size divides this model's attention heads.")
    node_tp = tps[-1]
    if node_tp != hardware.gpus_per_node:
        plan.notes.append(
            f"TP {node_tp} uses {node_tp} of {hardware.gpus_per_node} GPUs per node: vLLM "
            f"needs the {arch.num_attention_heads} attention heads to divide by TP."
        )

    replicated = ev.evaluate(node_tp, 1)
    plan.evaluated.append(replicated)
    if replicated.fits:
        plan.decision, plan.layout = "replicated", replicated
        plan.instances, plan.nodes_per_instance = hardware.nodes, 1
        for tp in tps:
            candidate = replicated if tp == node_tp else ev.evaluate(tp, 1)
            if tp != node_tp:
                plan.evaluated.append(candidate)
            if candidate.fits:
                plan.smallest_tp = tp
                break
        return plan

    max_pp = min(hardware.nodes, arch.num_layers)
    best = replicated
    for pp in range(2, max_pp + 1):
        best = ev.evaluate(node_tp, pp)
        plan.evaluated.append(best)
        if best.fits:
            plan.decision, plan.layout = "pipeline", best
            plan.instances, plan.nodes_per_instance = hardware.nodes // pp, pp
            plan.idle_nodes = hardware.nodes % pp
            if plan.idle_nodes:
                plan.notes.append(
                    f"{plan.idle_nodes} node(s) left over: instances need {pp} nodes each."
                )
            decode = targets.decode_rate or max_num_seqs * 1000 / targets.tpot_ms
            plan.network = PipelineNetwork(
                stages=pp, hidden_size=arch.hidden_size,
                dtype_bytes=DTYPE_BY_NAME[weights.dtype][1], max_num_seqs=max_num_seqs,
                prefill_rate=targets.prefill_rate or decode, decode_rate=decode,
                tpot_ms=targets.tpot_ms,
            )
            return plan

    plan.layout = best
    plan.shortfall_bytes = best.shortfall_bytes
    plan.suggestions = _suggestions(ev, best, arch, weights, hardware, targets, tensors)
    return plan


def _suggestions(ev: _Evaluator, best: Layout, arch: Architecture, weights: Weights,
                 hardware: Hardware, targets: Targets, tensors: Any) -> list[str]:
    """What would make it fit, each a concrete change with its result."""
    out: list[str] = []
    tp, pp = best.tp, best.pp
    fixed = best.weights_bytes + best.overhead.total
    if fixed > best.usable_bytes:
        out.append(
            f"weights ({_gib(best.weights_bytes)} GiB) and overhead "
            f"({_gib(best.overhead.total)} GiB) alone exceed the "
            f"{_gib(best.usable_bytes)} GiB usable per GPU at TP {tp} x PP {pp}."
        )
    lower = _lower_precision(ev, tp, arch, weights, hardware, targets, tensors)
    if lower:
        out.append(lower)
    if ev.kv_bytes > 1:
        alt = _Evaluator(arch, weights, hardware, targets, ev.context, ev.concurrency,
                         ev.max_num_seqs, ev.batched, 1)
        if alt.evaluate(tp, pp).fits:
            out.append("fp8 KV cache: --kv-cache-dtype fp8 halves the KV cache and fits.")
    if fixed < best.usable_bytes:
        longest = ev.longest_context(tp, pp)
        if longest >= targets.block_size:
            out.append(f"shorter context: --context {longest} fits "
                       f"{ev.concurrency} sequence(s) at TP {tp} x PP {pp}.")
        sequences = math.floor(best.capacity.max_concurrency)
        if ev.concurrency > 1 and sequences >= 1:
            out.append(f"fewer sequences: --concurrency {sequences} fits at context "
                       f"{ev.context}.")
    for more in range(hardware.nodes + 1, arch.num_layers + 1):
        if ev.evaluate(tp, more).fits:
            out.append(f"more nodes: {more} nodes like these (pipeline of {more}, "
                       f"TP {tp}) fit; the fleet has {hardware.nodes}.")
            break
    if not out:
        out.append("nothing within reach fits: use GPUs with more memory.")
    return out


def _lower_precision(ev: _Evaluator, tp: int, arch: Architecture, weights: Weights,
                     hardware: Hardware, targets: Targets, tensors: Any) -> str | None:
    """The first lower-precision format that fits on the fleet, as a suggestion."""
    current = weights.scheme.name
    for scheme in PRECISION_LADDER:
        if current != "none" and PRECISION_LADDER.index(scheme) <= _rank(current):
            continue
        try:
            # An unquantized checkpoint's shapes re-quantize; a quantized one's do not.
            lower = build_weights(arch, tensors if current == "none" else None,
                                  targets.dtype, scheme)
        except PlannerError:
            continue
        alt = _Evaluator(arch, lower, hardware, targets, ev.context, ev.concurrency,
                         ev.max_num_seqs, ev.batched, ev.kv_bytes)
        for pp in range(1, min(hardware.nodes, arch.num_layers) + 1):
            if alt.evaluate(tp, pp).fits:
                shape = "on one node" if pp == 1 else f"as a pipeline of {pp} nodes"
                return (f"lower precision: --quantization {scheme} "
                        f"({_gib(lower.total_bytes)} GiB of weights) fits {shape}.")
    return None


def _rank(scheme: str) -> int:
    """Position of a scheme on the precision ladder (nvfp4/mxfp4 rank as int4)."""
    order = {"fp8": 0, "int8": 0, "int4": 1, "nvfp4": 1, "mxfp4": 1}
    return order.get(scheme, -1)
