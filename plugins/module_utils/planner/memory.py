"""KV-cache bytes, per-GPU overhead, and KV-cache capacity the way vLLM counts it.

KV cache per token and layer (vLLM ``vllm/v1/kv_cache_interface.py``):

* attention with K and V (``FullAttentionSpec``, ``SlidingWindowSpec``):
  ``2 x kv_heads_per_gpu x head_dim x kv_dtype_bytes``, where
  ``kv_heads_per_gpu = max(1, kv_heads // TP)``: each tensor-parallel rank
  keeps its share of the KV heads, and at least one.
* multi-head latent attention (``MLAAttentionSpec``, DeepSeek V2/V3, Kimi K2):
  one latent "head" of ``kv_lora_rank + qk_rope_head_dim`` values and no
  separate V, so ``(kv_lora_rank + qk_rope_head_dim) x kv_dtype_bytes``. It is
  not divided by TP: every rank holds the whole latent cache.

A page (block) holds ``block_size`` tokens (16 on GPU; on CPU 128, except 16 for
MLA models on CPUs without AMX, whose reference MLA kernel needs it; see
``vllm/platforms/cpu.py``). vLLM turns the memory left for the KV
cache into blocks (``get_kv_cache_config_from_groups``):

* one kind of layer (all full attention, or all sliding with one window):
  ``num_blocks = memory // (block_size x bytes per token summed over layers)``;
* full and sliding layers mixed (hybrid allocator): layers are grouped into
  groups of equal size (the smallest kind's count, or the largest when within
  1.5x), ``num_blocks = memory // (group_size x page)``.

A request of ``max_model_len`` tokens needs ``cdiv(max_model_len, block_size)``
blocks in a full-attention group and ``cdiv(min(window - 1 + in_flight,
max_model_len), block_size) + 1`` in a sliding-window group (in_flight =
``max_num_batched_tokens``). ``max_concurrency = num_blocks / blocks per
request`` and vLLM logs ``KV cache size: int(max_concurrency x
max_model_len) tokens`` (``get_kv_cache_capacity``). With pipeline parallel,
every stage sizes its own layers and the engine takes the smallest block count.

Memory on one GPU (vLLM ``gpu_worker.determine_available_memory``): the KV
cache gets ``total x gpu_memory_utilization`` minus weights, the peak of a
profiling forward pass (activations), memory outside PyTorch (CUDA context,
cuBLAS and NCCL workspaces) and, since vLLM 0.21, the CUDA-graph estimate. The
planner cannot run the profile, so it uses the conservative constants below.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.architecture import (
    Architecture,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.errors import PlannerError

GiB = 1 << 30

#: Memory outside PyTorch on every GPU: CUDA context, cuBLAS workspaces. vLLM's
#: start-up log reports it as "non_torch_memory takes X GiB": typically 0.1-0.6 GiB on one
#: GPU in its memory-profiling logs; 1 GiB keeps a margin.
NON_TORCH_BYTES = 1 * GiB

#: Extra on every GPU when TP x PP > 1: NCCL communicators and buffers plus
#: vLLM's custom all-reduce buffers, which appear in non_torch_memory once the
#: engine spans GPUs (0.3-1 GiB observed); 1 GiB.
MULTI_GPU_BYTES = 1 * GiB

#: CUDA graphs captured for decode batch sizes up to 512 (vLLM's
#: ``max_cudagraph_capture_size``). vLLM logs "Graph capturing finished in N
#: secs, took X GiB", typically 0.3-1.5 GiB, and from v0.21 subtracts its estimate
#: from the KV budget (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1``); 1.5 GiB.
CUDA_GRAPH_BYTES = 3 * GiB // 2

#: Sampler: the profiling run samples ``max_num_seqs`` rows over the whole vocab,
#: logits in float32 plus a probability copy: 2 x 4 bytes per vocab entry.
SAMPLER_BYTES_PER_VOCAB_ENTRY = 8

#: vLLM's default block size on GPU (``CacheConfig.DEFAULT_BLOCK_SIZE``).
GPU_BLOCK_SIZE = 16
#: CPU build: 128 tokens per block; 16 for MLA models when the CPU lacks AMX and
#: vLLM falls back to its reference MLA kernel (``platforms/cpu.py``).
CPU_BLOCK_SIZE = 128
CPU_REFERENCE_MLA_BLOCK_SIZE = 16
#: CPU build, API server: ``max_num_batched_tokens`` default 2048 per rank.
CPU_MAX_NUM_BATCHED_TOKENS = 2048

KV_CACHE_DTYPES = {"auto": 0, "bfloat16": 2, "float16": 2, "float32": 4,
                   "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def engine_defaults(gpu_memory_bytes: float) -> tuple[int, int]:
    """vLLM's API-server defaults (max_num_batched_tokens, max_num_seqs) per GPU size.

    From ``EngineArgs._set_default_max_num_seqs_and_batched_tokens_args``: GPUs of
    160 GiB and more get 16384 / 1024, of 70 GiB and more 8192 / 1024 (A100s are
    excluded there and get the smaller pair; the planner uses the larger, which
    is the conservative choice), others 2048 / 256.
    """
    if gpu_memory_bytes >= 160 * GiB:
        return 16384, 1024
    if gpu_memory_bytes >= 70 * GiB:
        return 8192, 1024
    return 2048, 256


def kv_dtype_bytes(kv_cache_dtype: str, model_dtype: str) -> int:
    """Bytes per KV element; ``auto`` follows the model dtype."""
    key = kv_cache_dtype.lower()
    if key not in KV_CACHE_DTYPES:
        raise PlannerError(
            f"--kv-cache-dtype {kv_cache_dtype!r} is not known; use one of "
            f"{', '.join(KV_CACHE_DTYPES)}."
        )
    if key == "auto":
        return {"bfloat16": 2, "float16": 2, "float32": 4}[model_dtype]
    return KV_CACHE_DTYPES[key]


@dataclass(frozen=True)
class LayerCache:
    """The KV cache of one layer on one GPU."""

    bytes_per_token: int
    window: int | None = None  # None: full attention


def layer_caches(arch: Architecture, kv_bytes: int, tp: int = 1) -> list[LayerCache]:
    """Per-layer KV cache on one GPU under tensor parallel ``tp``."""
    if arch.mla:
        per_token = (arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim) * kv_bytes
        return [LayerCache(per_token, w) for w in arch.layer_windows]
    heads = max(1, arch.num_kv_heads // tp)
    per_token = 2 * heads * arch.head_dim * kv_bytes
    return [LayerCache(per_token, w) for w in arch.layer_windows]


def kv_bytes_per_token(arch: Architecture, kv_bytes: int, tp: int = 1) -> int:
    """KV-cache bytes one token costs over all layers, on one GPU."""
    return sum(c.bytes_per_token for c in layer_caches(arch, kv_bytes, tp))


@dataclass(frozen=True)
class KVCapacity:
    """What vLLM would report for one engine (one pipeline stage's GPU)."""

    num_blocks: int
    block_size: int
    bytes_per_block: int
    blocks_per_request: int
    max_model_len: int

    @property
    def max_concurrency(self) -> float:
        """Requests of ``max_model_len`` tokens that fit at once."""
        return self.num_blocks / self.blocks_per_request

    @property
    def tokens(self) -> int:
        """The figure vLLM logs as "KV cache size: N tokens"."""
        return int(self.max_concurrency * self.max_model_len)


def _blocks_per_request(window: int | None, block_size: int, max_model_len: int,
                        in_flight: int) -> int:
    if window is None:
        return math.ceil(max_model_len / block_size)
    tokens = min(window - 1 + in_flight, max_model_len)
    return math.ceil(tokens / block_size) + 1


def block_layout(caches: list[LayerCache], block_size: int, max_model_len: int,
                 in_flight: int) -> tuple[int, int]:
    """(bytes per block, blocks per request) for these layers; see module docstring."""
    if not caches:
        raise PlannerError("no attention layers on this pipeline stage.")
    buckets: dict[int | None, list[LayerCache]] = {}
    for cache in caches:
        buckets.setdefault(cache.window, []).append(cache)
    if len(buckets) == 1:
        (window, layers), = buckets.items()
        per_block = block_size * sum(c.bytes_per_token for c in layers)
        return per_block, _blocks_per_request(window, block_size, max_model_len, in_flight)
    pages = {c.bytes_per_token for c in caches}
    if len(pages) > 1:
        raise PlannerError(
            "layers with different KV sizes per token mixed with sliding windows are not "
            "covered by the planner."
        )
    counts = [len(layers) for layers in buckets.values()]
    group_size = max(counts) if max(counts) < min(counts) * 1.5 else min(counts)
    per_block = group_size * block_size * pages.pop()
    blocks = 0
    for window, layers in buckets.items():
        groups = math.ceil(len(layers) / group_size)
        blocks += groups * _blocks_per_request(window, block_size, max_model_len, in_flight)
    return per_block, blocks


def kv_capacity(caches: list[LayerCache], available_bytes: int, block_size: int,
                max_model_len: int, in_flight: int) -> KVCapacity:
    """Blocks, concurrency and tokens for ``available_bytes`` of KV cache memory."""
    per_block, per_request = block_layout(caches, block_size, max_model_len, in_flight)
    num_blocks = max(0, available_bytes) // per_block
    return KVCapacity(num_blocks, block_size, per_block, per_request, max_model_len)


def cpu_kv_capacity(arch: Architecture, kvcache_space_gib: int, max_model_len: int | None = None,
                    kv_cache_dtype: str = "auto", dtype: str = "auto",
                    block_size: int | None = None,
                    max_num_batched_tokens: int = CPU_MAX_NUM_BATCHED_TOKENS,
                    amx: bool = True, pipeline_parallel_size: int = 1) -> KVCapacity:
    """What vLLM's CPU build logs for ``VLLM_CPU_KVCACHE_SPACE=kvcache_space_gib``.

    The CPU worker uses exactly that space for the KV cache (weights do not count
    against it; ``platforms/cpu.py`` turns the variable into
    ``kv_cache_memory_bytes``). ``max_model_len`` defaults to the model's and
    ``max_num_batched_tokens`` to the CPU API server's 2048, as in vLLM; the
    latter matters only for sliding-window layers. ``amx``: whether the CPU has
    AMX tiles, which decides the block size of MLA models. ``pipeline_parallel_size``:
    every node of a pipeline instance gives that space to its own stage's layers, and
    the instance (its rank 0 logs it) holds the smallest stage's block count.
    """
    from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.weights import (
        pp_layer_ranges,
        resolve_dtype,
    )

    kv_bytes = kv_dtype_bytes(kv_cache_dtype, resolve_dtype(dtype, arch))
    if block_size is None:
        block_size = CPU_REFERENCE_MLA_BLOCK_SIZE if arch.mla and not amx else CPU_BLOCK_SIZE
    caches = layer_caches(arch, kv_bytes)
    stages = [
        kv_capacity(caches[start:end], kvcache_space_gib * GiB, block_size,
                    max_model_len or arch.max_position_embeddings, max_num_batched_tokens)
        for start, end in pp_layer_ranges(arch.num_layers, pipeline_parallel_size)
    ]
    worst = min(stages, key=lambda c: c.num_blocks)
    return replace(worst, blocks_per_request=max(c.blocks_per_request for c in stages))


@dataclass(frozen=True)
class Overhead:
    """Per-GPU memory that is neither weights nor KV cache."""

    non_torch: int
    multi_gpu: int
    activations: int
    cuda_graphs: int

    @property
    def total(self) -> int:
        return self.non_torch + self.multi_gpu + self.activations + self.cuda_graphs


def activation_bytes(arch: Architecture, tp: int, dtype_bytes: int,
                     max_num_batched_tokens: int, max_num_seqs: int) -> int:
    """Peak of vLLM's profiling forward pass on one GPU, estimated from above.

    vLLM runs ``max_num_batched_tokens`` dummy tokens through the model and samples
    ``max_num_seqs`` rows; it logs the result as "PyTorch activation peak memory".
    The estimate keeps, per token, four hidden-size buffers (residual, normed
    input, attention output, MLP output), the q/k/v projection output and the
    MLP's gate+up output (for MoE: the top-k experts' plus the shared experts'),
    sharded by TP; plus the sampler's float32 logits and probabilities over the
    whole vocabulary.
    """
    if arch.mla:
        m = arch.mla
        attn = arch.num_attention_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim) * 2
    else:
        attn = (arch.num_attention_heads + 2 * arch.num_kv_heads) * arch.head_dim
    mlp = arch.intermediate_size
    if arch.moe:
        moe_mlp = (arch.moe.experts_per_token * arch.moe.expert_intermediate_size
                   + arch.moe.shared_intermediate_size)
        mlp = max(mlp if not all(arch.moe.moe_layers) else 0, moe_mlp)
    per_token = 4 * arch.hidden_size + (attn + 2 * mlp) / tp
    sampler = max_num_seqs * arch.vocab_size * SAMPLER_BYTES_PER_VOCAB_ENTRY
    return math.ceil(max_num_batched_tokens * per_token * dtype_bytes + sampler)


def overhead(arch: Architecture, tp: int, pp: int, dtype_bytes: int,
             max_num_batched_tokens: int, max_num_seqs: int,
             cuda_graphs: bool = True) -> Overhead:
    """The per-GPU overhead the planner reserves; constants documented above."""
    return Overhead(
        non_torch=NON_TORCH_BYTES,
        multi_gpu=MULTI_GPU_BYTES if tp * pp > 1 else 0,
        activations=activation_bytes(arch, tp, dtype_bytes, max_num_batched_tokens,
                                     max_num_seqs),
        cuda_graphs=CUDA_GRAPH_BYTES if cuda_graphs else 0,
    )


#: The line vLLM logs once the KV cache is sized (``update_kv_cache_capacity``), e.g.
#: "CPU KV cache size: 524,288 tokens, Maximum concurrency for 2,048 tokens per
#: request: 256.00x" ("GPU KV cache size" on GPUs).
KV_CACHE_LOG_RE = re.compile(
    r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per "
    r"request: ([\d.]+)x"
)


def parse_kv_cache_log(text: str) -> tuple[int, int, float] | None:
    """(tokens, max_model_len, max_concurrency) from vLLM's log, or None if absent."""
    match = KV_CACHE_LOG_RE.search(text)
    if not match:
        return None
    return (int(match[1].replace(",", "")), int(match[2].replace(",", "")), float(match[3]))
