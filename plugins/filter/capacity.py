"""Capacity-plan filters: the preflight uses the same planner as `inferfleet plan`.

    plan: "{{ inferfleet_model_location | inferfleet.fleet.capacity_plan(
                gpus_per_node=8, gpu_memory_gib=80, nodes=groups['inference'] | length,
                context=8192, concurrency=16) }}"
    _: "{{ plan | inferfleet.fleet.capacity_require(instance_nodes=2) }}"

and the engine role's check of what the engine sized against the plan:

    logged: "{{ engine_log | inferfleet.fleet.kv_logged }}"
    planned: "{{ config | inferfleet.fleet.cpu_kv_tokens(1, max_model_len=1024, dtype='float16') }}"

The model is a folder or ``s3://bucket/prefix`` as seen from the controller (or a
config.json mapping). Keyword arguments are the planner's targets: context,
concurrency, dtype, quantization, kv_cache_dtype, gpu_memory_utilization, plus
endpoint_url for S3.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

_TARGET_KEYS = {"context", "concurrency", "dtype", "quantization", "kv_cache_dtype",
                "gpu_memory_utilization", "max_num_batched_tokens", "block_size"}


def _planner() -> Any:
    try:
        import ansible_collections.inferfleet.fleet.plugins.module_utils.planner as planner
    except ImportError as err:
        raise AnsibleFilterError(
            "the inferfleet package is not importable by the controller's Python "
            f"({err}); install it there with `pip install -e .`."
        ) from err
    return planner


def capacity_plan(model: Any, gpus_per_node: int, gpu_memory_gib: float, nodes: int = 1,
                  endpoint_url: str | None = None, **targets: Any) -> dict[str, Any]:
    """The plan as a dict (``inferfleet plan --json``)."""
    planner = _planner()
    unknown = sorted(set(targets) - _TARGET_KEYS)
    if unknown:
        raise AnsibleFilterError(
            f"capacity_plan: unknown argument(s) {', '.join(unknown)}; known: "
            f"{', '.join(sorted(_TARGET_KEYS | {'endpoint_url'}))}."
        )
    targets = {k: v for k, v in targets.items() if v not in (None, "")}
    try:
        hardware = planner.Hardware(int(gpus_per_node), float(gpu_memory_gib), int(nodes))
        wanted = planner.Targets(**targets)
        if isinstance(model, dict):
            return planner.plan_config(dict(model), hardware, wanted).to_dict()
        source = planner.load_model(str(model), endpoint_url=endpoint_url)
        return planner.plan_model(source, hardware, wanted).to_dict()
    except planner.PlannerError as err:
        raise AnsibleFilterError(f"capacity plan for {model}: {err}") from err
    except (TypeError, ValueError) as err:
        raise AnsibleFilterError(f"capacity_plan: bad argument: {err}") from err


def refusal(plan: dict[str, Any]) -> str:
    """The message for a plan where nothing fits, with its numbers."""
    hw = plan["hardware"]
    gpu = plan["per_gpu"] or {}
    targets = plan["targets"]
    lines = [
        f"{plan['model']['location']} does not fit {hw['nodes']} node(s) x "
        f"{hw['gpus_per_node']} GPU(s) x {hw['gpu_memory_gib']:g} GiB at context "
        f"{targets['context']} x {targets['concurrency']} sequence(s): short by "
        f"{plan['shortfall_gib']} GiB per GPU at TP {plan['tensor_parallel_size']} x PP "
        f"{plan['pipeline_parallel_size']} (weights {gpu.get('weights_gib')} GiB + overhead "
        f"{gpu.get('overhead_gib')} GiB + KV cache needed, of {gpu.get('usable_gib')} GiB "
        "usable).",
    ]
    lines += [f"To fit: {s}" for s in plan["suggestions"]]
    return " ".join(lines)


def capacity_require(plan: dict[str, Any], instance_nodes: int | None = None
                     ) -> dict[str, Any]:
    """Pass the plan through, or fail with the numbers when the fleet cannot work.

    ``instance_nodes``: nodes per instance the inventory declares; refused when
    smaller than the pipeline the model needs.
    """
    if not isinstance(plan, dict) or "decision" not in plan:
        raise AnsibleFilterError("inferfleet_capacity_require expects the output of "
                                 "inferfleet_capacity_plan.")
    if plan["decision"] == "does_not_fit":
        raise AnsibleFilterError(refusal(plan))
    needed = int(plan["nodes_per_instance"])
    if instance_nodes is not None and int(instance_nodes) < needed:
        gpu = plan["per_gpu"]
        raise AnsibleFilterError(
            f"{plan['model']['location']} needs instances of {needed} nodes (pipeline "
            f"parallel {needed} x TP {plan['tensor_parallel_size']}: {gpu['weights_gib']} GiB "
            f"of weights per GPU) but the inventory declares instances of {instance_nodes} "
            f"node(s). Give every {needed} nodes one `inferfleet_instance` host variable, "
            "or use a smaller model or a lower precision."
        )
    return plan


def kv_logged(text: str) -> int | None:
    """The KV-cache size in tokens that vLLM logged last ("KV cache size: N tokens") in
    `text` (an engine's log, oldest first), or None."""
    from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.memory import (
        parse_kv_cache_log,
    )

    lines = [line for line in str(text or "").splitlines() if "KV cache size:" in line]
    found = parse_kv_cache_log(lines[-1]) if lines else None
    return None if found is None else found[0]


def cpu_kv_tokens(config: dict[str, Any], kvcache_space_gib: int,
                  max_model_len: int | None = None, dtype: str = "auto",
                  kv_cache_dtype: str = "auto", pipeline_parallel_size: int = 1) -> int:
    """The planner's KV-cache size in tokens for vLLM's CPU build with
    VLLM_CPU_KVCACHE_SPACE=kvcache_space_gib (what the engine, or a pipeline instance's
    rank 0, logs when it starts)."""
    planner = _planner()
    try:
        arch = planner.parse_architecture(dict(config))
        return planner.cpu_kv_capacity(
            arch,
            int(kvcache_space_gib),
            max_model_len=int(max_model_len) if max_model_len else None,
            dtype=dtype or "auto",
            kv_cache_dtype=kv_cache_dtype or "auto",
            pipeline_parallel_size=int(pipeline_parallel_size),
        ).tokens
    except planner.PlannerError as err:
        raise AnsibleFilterError(f"inferfleet_cpu_kv_tokens: {err}") from err


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "capacity_plan": capacity_plan,
            "capacity_require": capacity_require,
            "kv_logged": kv_logged,
            "cpu_kv_tokens": cpu_kv_tokens,
        }
