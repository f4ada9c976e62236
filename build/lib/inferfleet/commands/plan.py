"""`inferfleet plan`: does a model fit the fleet, and how to run it.

Pure Python (no playbook). Exit codes: 0 a layout fits, 1 nothing fits (the
output says what would), 2 bad input (the message says what to change).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
import yaml
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner import (
    Hardware,
    PlannerError,
    Targets,
    load_model,
    plan_model,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.plan import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    Plan,
)
from rich.console import Console

from inferfleet.plan_view import render

EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_BAD_INPUT = 0, 1, 2


def _error(message: str, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    Console(stderr=True, soft_wrap=True).print(f"[red]error:[/] {message}")
    return typer.Exit(code)


def write_group_vars(plan: Plan, path: Path) -> None:
    """Write the roles' variables as a group_vars YAML file."""
    header = (
        "# Written by `inferfleet plan` for "
        f"{plan.location}\n# {plan.hardware.nodes} node(s) x {plan.hardware.gpus_per_node} "
        f"GPU(s) x {plan.hardware.gpu_memory_gib:g} GiB; context {plan.context}, "
        f"{plan.concurrency} sequence(s). Re-run the planner rather than editing.\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(plan.group_vars(), sort_keys=False))


def plan_command(
    model: str = typer.Argument(
        ..., help="Model folder, a config.json, or s3://bucket/prefix (config + headers only)."
    ),
    gpus_per_node: int = typer.Option(..., "--gpus-per-node", help="GPUs in each node."),
    gpu_memory_gib: float = typer.Option(..., "--gpu-memory-gib", help="Memory of one GPU."),
    nodes: int = typer.Option(1, "--nodes", help="Nodes in the fleet."),
    context: int | None = typer.Option(
        None, "--context", help="Max model length in tokens [default: the model's]."
    ),
    concurrency: int | None = typer.Option(
        None, "--concurrency",
        help="Sequences at full context each instance must hold [default: 1; engine "
             "max_num_seqs then stays at vLLM's default].",
    ),
    dtype: str = typer.Option("auto", "--dtype", help="auto, bfloat16, float16, float32."),
    quantization: str | None = typer.Option(
        None, "--quantization",
        help="fp8, int8, int4 (awq/gptq), nvfp4, mxfp4 [default: the checkpoint's].",
    ),
    kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype", help="auto or fp8."),
    gpu_memory_utilization: float = typer.Option(
        DEFAULT_GPU_MEMORY_UTILIZATION, "--gpu-memory-utilization",
        help="Fraction of each GPU vLLM may use.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
    write_vars: Path | None = typer.Option(
        None, "--write-vars", help="Write the roles' group_vars (YAML) to this file.",
    ),
    endpoint_url: str | None = typer.Option(
        None, "--endpoint-url", envvar="AWS_ENDPOINT_URL", help="S3 endpoint for s3:// models."
    ),
) -> None:
    """Does the model fit the fleet, in which topology, with which engine settings."""
    try:
        source = load_model(model, endpoint_url=endpoint_url)
        plan = plan_model(
            source,
            Hardware(gpus_per_node=gpus_per_node, gpu_memory_gib=gpu_memory_gib, nodes=nodes),
            Targets(
                context=context,
                concurrency=concurrency,
                dtype=dtype,
                quantization=quantization,
                kv_cache_dtype=kv_cache_dtype,
                gpu_memory_utilization=gpu_memory_utilization,
            ),
        )
    except PlannerError as err:
        raise _error(str(err)) from None
    if as_json:
        sys.stdout.write(json.dumps(plan.to_dict(), indent=2) + "\n")
    else:
        render(plan, Console())
    if not plan.fits:
        if write_vars is not None:
            raise _error(f"nothing fits, so {write_vars} was not written.", EXIT_DOES_NOT_FIT)
        raise typer.Exit(EXIT_DOES_NOT_FIT)
    if write_vars is not None:
        try:
            write_group_vars(plan, write_vars)
        except OSError as err:
            raise _error(f"cannot write {write_vars}: {err.strerror or err}") from None
        if not as_json:
            Console().print(f"wrote {write_vars}")
    raise typer.Exit(EXIT_FITS)


