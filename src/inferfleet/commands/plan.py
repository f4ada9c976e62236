"""`inferfleet plan`: does a model fit the fleet, and how to run it.

Pure Python (no playbook). Exit codes: 0 a layout fits, 1 nothing fits (the
output says what would), 2 bad input (the message says what to change).

With ``--models FILE`` it plans several models on one fleet (module_utils.planner.fleet):
each model's topology and instance count, and which nodes serve which model.
"""

from __future__ import annotations

import datetime
import json
import shutil
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import typer
import yaml
from ansible_collections.inferfleet.fleet.plugins.module_utils.instances import (
    MODEL_VARIABLES,
    InventoryError,
    instances,
    served_model,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner import (
    FleetPlan,
    Hardware,
    ModelRequest,
    PlannerError,
    Targets,
    check_inventory,
    check_names,
    load_model,
    plan_fleet,
    plan_model,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.planner.plan import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_TPOT_MS,
    Plan,
)
from rich.console import Console
from rich.markup import escape

from inferfleet.plan_view import render, render_fleet, routing_advice

EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_BAD_INPUT = 0, 1, 2

#: The keys a model entry of ``--models FILE`` may have.
MODEL_KEYS = ("name", "source", "version", "concurrency", "context", "dtype", "quantization",
              "kv_cache_dtype", "gpu_memory_utilization", "group")


def _error(message: str, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    Console(stderr=True, soft_wrap=True).print(f"[red]error:[/] {escape(message)}")
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


#: The first line of every file `inferfleet plan` writes starts so: such files may be
#: replaced by the next run; any other file is refused.
WRITTEN_BY = "# Written by `inferfleet plan"
#: ... and of the files of ``--models --write-vars DIR``.
FLEET_WRITTEN_BY = "# Written by `inferfleet plan --models`"
#: What ``--write-vars DIR`` writes with ``--models``, relative to DIR.
FLEET_INVENTORY = "models.yml"


def fleet_files(fleet: FleetPlan) -> dict[str, str]:
    """The files ``--write-vars DIR`` writes with ``--models``, relative to DIR: the
    inventory source models.yml (the model groups and their hosts) and per model group
    group_vars/<group>.yml (its model and engine settings; a group_vars/ file outranks
    group_vars/all and group_vars/inference, group vars inside an inventory file would
    not)."""
    hw = fleet.hardware
    models = ", ".join(f"{m.name} ({m.instances} x {m.plan.nodes_per_instance} node(s))"
                       for m in fleet.models)
    files = {FLEET_INVENTORY: (
        f"{FLEET_WRITTEN_BY} for {len(fleet.hosts)} node(s) x {hw.gpus_per_node} "
        f"GPU(s) x {hw.gpu_memory_gib:g} GiB:\n# {models}; spare: "
        f"{', '.join(fleet.spare) or 'none'}.\n"
        "# The model groups under `inference` and their hosts; each group's variables are in\n"
        "# group_vars/<group>.yml beside this file. Use this folder as an inventory after\n"
        "# yours (ansible-playbook -i INVENTORY -i THIS_FOLDER), or write it into the\n"
        "# inventory folder itself. Spare nodes serve the fleet-wide model.\n"
        "# Re-run the planner rather than editing.\n"
        + yaml.safe_dump(fleet.inventory(), sort_keys=False)
    )}
    for model, (group, variables) in zip(fleet.models, fleet.group_vars().items(),
                                         strict=True):
        files[f"group_vars/{group}.yml"] = (
            f"{FLEET_WRITTEN_BY} for the group {group} of {FLEET_INVENTORY}:\n"
            f"# {model.name} from {model.plan.location}\n# {model.instances} x "
            f"{model.plan.nodes_per_instance} node(s); context {model.plan.context}, "
            f"{model.target} sequence(s) across its instances.\n"
            "# Re-run the planner rather than editing.\n"
            + yaml.safe_dump(variables, sort_keys=False)
        )
    return files


def _first_line(path: Path) -> str:
    try:
        with path.open(encoding="utf-8", errors="replace") as file:
            return file.readline()
    except OSError:
        return ""


def check_fleet_target(directory: Path, names: Iterable[str]) -> None:
    """Raise PlannerError unless ``directory`` can take the files ``names``: a folder (or
    none yet) where each of them is absent or was written by `inferfleet plan`."""
    where = f"--write-vars {directory}"
    if directory.exists() and not directory.is_dir():
        raise PlannerError(f"{where} is a file: with --models it takes an inventory folder "
                           "(it writes models.yml and group_vars/<group>.yml there).")
    if not directory.exists() and directory.suffix in (".yml", ".yaml", ".json"):
        raise PlannerError(f"{where}: with --models it takes an inventory folder (it writes "
                           f"models.yml and group_vars/<group>.yml there), not a file: give "
                           f"{directory.parent} or another folder.")
    for name in names:
        path = directory / name
        if path.is_dir() or ((path.exists() or path.is_symlink())
                             and not _first_line(path).startswith(WRITTEN_BY)):
            raise PlannerError(f"{where}: {path} exists and was not written by `inferfleet "
                               "plan`, so nothing was written: move it away, or write to "
                               "another folder.")


def write_fleet_files(files: dict[str, str], directory: Path) -> list[Path]:
    """Write ``files`` (from :func:`fleet_files`) into ``directory``; raises PlannerError
    (nothing written) for a file it did not write. Returns what it wrote."""
    check_fleet_target(directory, files)
    (directory / "group_vars").mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        (directory / name).write_text(text)
        written.append(directory / name)
    return written


def _text(where: str, key: str, value: Any, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        raise PlannerError(f"{where}: `{key}` must be a non-empty string, not {value!r}.")
    return value


def _whole(where: str, key: str, value: Any, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlannerError(f"{where}: `{key}` must be a whole number of at least 1, "
                           f"not {value!r}.")
    return value


def read_models_file(path: Path, defaults: Targets) -> list[dict[str, Any]]:
    """The checked entries of a ``--models`` file: each with name, location (a source
    relative to the file's folder resolved), version, concurrency, group and Targets
    (the command-line flags, overridden by the entry's own keys)."""
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise PlannerError(f"--models {path}: no such file.") from None
    except OSError as err:
        raise PlannerError(f"--models {path}: cannot read it: {err.strerror or err}.") from None
    except UnicodeDecodeError:
        raise PlannerError(f"--models {path}: not a text file; write it as YAML.") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark is not None else ""
        raise PlannerError(f"--models {path}: not valid YAML{at}: "
                           f"{getattr(err, 'problem', None) or err}.") from None
    if not isinstance(data, dict) or set(data) != {"models"}:
        raise PlannerError(f"--models {path}: write one key, `models:`, holding a list of "
                           "models (name, source, concurrency, ...).")
    if not isinstance(data["models"], list) or not data["models"]:
        raise PlannerError(f"--models {path}: `models` must be a non-empty list of models.")
    entries = []
    for number, raw in enumerate(data["models"], start=1):
        where = f"--models {path}: model {number}"
        if not isinstance(raw, dict):
            raise PlannerError(f"{where}: write it as a mapping (name: ..., source: ...).")
        if isinstance(raw.get("name"), str):
            where += f" ({raw['name']})"
        unknown = sorted(str(key) for key in raw if key not in MODEL_KEYS)
        if unknown:
            raise PlannerError(f"{where}: unknown key(s) {', '.join(unknown)}: use "
                               f"{', '.join(MODEL_KEYS)}.")
        for key in ("name", "source"):
            if key not in raw:
                raise PlannerError(f"{where}: `{key}` is missing: every model needs a name "
                                   "(what clients send as `model`) and a source.")
        name = _text(where, "name", raw["name"])
        source = _text(where, "source", raw["source"])
        version = raw.get("version")
        if isinstance(version, datetime.date | int | float) and not isinstance(version, bool):
            version = str(version)  # an unquoted 2024-07-23 reads as a date
        version = _text(where, "version", version, optional=True)
        utilization = raw.get("gpu_memory_utilization", defaults.gpu_memory_utilization)
        if (isinstance(utilization, bool) or not isinstance(utilization, int | float)
                or not 0 < utilization <= 1):
            raise PlannerError(f"{where}: `gpu_memory_utilization` must be in (0, 1], "
                               f"e.g. 0.9, not {utilization!r}.")
        targets = Targets(
            context=_whole(where, "context", raw.get("context", defaults.context), True),
            dtype=_text(where, "dtype", raw.get("dtype", defaults.dtype)),
            quantization=_text(where, "quantization",
                               raw.get("quantization", defaults.quantization), True),
            kv_cache_dtype=_text(where, "kv_cache_dtype",
                                 raw.get("kv_cache_dtype", defaults.kv_cache_dtype)),
            gpu_memory_utilization=float(utilization),
            prefill_rate=defaults.prefill_rate,
            decode_rate=defaults.decode_rate,
            tpot_ms=defaults.tpot_ms,
        )
        location = source
        if not source.startswith("s3://") and not Path(source).is_absolute():
            location = str(path.parent / source)
        entries.append({
            "name": name, "location": location, "version": version, "targets": targets,
            "concurrency": _whole(where, "concurrency", raw.get("concurrency", 1)),
            "group": _text(where, "group", raw.get("group"), optional=True),
        })
    try:
        check_names([(entry["name"], entry["group"]) for entry in entries])
    except PlannerError as err:
        raise PlannerError(f"--models {path}: {err}") from None
    return entries


def _inventory_vars(sources: list[str], hosts: list[str] | None, names: set[str] | None
                    ) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """The `inference` hosts (or ``hosts``) of these inventory sources, in order, and the
    variables ``names`` (None: every one) of each, templated as a playbook would."""
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    try:
        loader = DataLoader()
        inv = InventoryManager(loader=loader, sources=sources)
        varman = VariableManager(loader=loader, inventory=inv)
        if hosts is None:
            # Plain str: Ansible's tagged strings do not dump as YAML.
            hosts = [str(host) for host in inv.get_groups_dict().get("inference", [])]
        hostvars = {}
        for host in hosts:
            raw = varman.get_vars(host=inv.get_host(host))
            templar = Templar(loader=loader, variables=raw)
            hostvars[host] = {k: templar.template(raw[k]) for k in raw
                              if names is None or k in names}
    except AnsibleError as err:
        raise InventoryError(f"inventory {sources[0]}: {str(err).splitlines()[0]}") from None
    return hosts, hostvars


def read_inventory(path: Path) -> tuple[list[str], dict[str, list[list[str]]]]:
    """The `inference` hosts of an inventory, in its order, and its assignment: served
    model -> instances, each its hosts in rank order. Raises InventoryError."""
    if not path.exists():
        raise InventoryError(f"inventory {path} not found: pass the inventory file or folder.")
    wanted = {"inferfleet_instance", "inferfleet_rank"}
    wanted.update(name for names in MODEL_VARIABLES.values() for name in names)
    hosts, hostvars = _inventory_vars([str(path)], None, wanted)
    if not hosts:
        raise InventoryError(f"inventory {path} has no hosts in the `inference` group: add the "
                             "engine nodes there.")
    assignment: dict[str, list[list[str]]] = {}
    for members in instances(hosts, hostvars).values():
        assignment.setdefault(served_model(hostvars[members[0]]), []).append(members)
    return hosts, assignment


def plan_overrides(inventory: Path, fleet: FleetPlan, files: dict[str, str],
                   directory: Path | None) -> list[str]:
    """What the inventory at ``inventory`` would override of the plan once ``files`` are
    written to ``directory``, as Ansible loads them: from the inventory's own folder when
    ``directory`` is it (or holds the inventory file), else as a second inventory after it
    (``-i INVENTORY -i DIR``). Host variables outrank group_vars/<group>.yml, and in one
    folder so do the group_vars of a host's deeper groups, or as deep ones sorting after
    it. One line per model and variable, and one per set of planned instances the
    inventory's inferfleet_instance / inferfleet_rank would regroup."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "inventory"
        same = directory is not None and directory.is_dir() and (
            inventory.resolve() == directory.resolve()
            or (inventory.is_file() and inventory.absolute().parent.resolve()
                == directory.resolve()))
        if same:
            shutil.copytree(directory, folder, ignore=shutil.ignore_patterns(".*"),
                            ignore_dangling_symlinks=True)
        for name, text in files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text)
        group_vars = fleet.group_vars()
        names = {key for variables in group_vars.values() for key in variables}
        names.update({"inferfleet_instance", "inferfleet_rank"})
        hosts, hostvars = _inventory_vars([str(folder)] if same else [str(inventory),
                                                                      str(folder)],
                                          None, names)
    planned = fleet.inventory()["all"]["children"]["inference"]["children"]
    lines = []
    for group, data in planned.items():
        wrong: dict[tuple[str, str], list[str]] = {}
        for host, own in data["hosts"].items():
            for key, value in {**group_vars[group], **own}.items():
                got = hostvars[host].get(key)
                if got != value:
                    wrong.setdefault((key, repr(value)), []).append(f"{host}={got!r}")
        for (key, value), where in wrong.items():
            lines.append(f"{group}: {key} should be {value} but the inventory keeps "
                         f"{', '.join(where)}")
    try:
        made = instances(hosts, hostvars)
    except InventoryError as err:
        return [*lines, f"the inventory with the plan: {err}"]
    for model in fleet.models:
        merged: dict[tuple[str, ...], list[str]] = {}  # what the inventory makes: planned
        for members in model.nodes:
            have = next(m for m in made.values() if members[0] in m)
            if have != members:
                merged.setdefault(tuple(have), []).append(" + ".join(members))
        for have, members in merged.items():
            lines.append(f"{model.group}: planned as {'; '.join(members)} but the "
                         f"inventory's inferfleet_instance / inferfleet_rank make the "
                         f"instance {' + '.join(have)}")
    return lines


def plan_command(
    model: str | None = typer.Argument(
        None, help="Model folder, a config.json, or s3://bucket/prefix (config + headers "
                   "only). Omit it with --models.",
    ),
    gpus_per_node: int = typer.Option(..., "--gpus-per-node", help="GPUs in each node."),
    gpu_memory_gib: float = typer.Option(..., "--gpu-memory-gib", help="Memory of one GPU."),
    nodes: int | None = typer.Option(
        None, "--nodes", help="Nodes in the fleet [default: 1, or the inventory's].",
        show_default=False,
    ),
    context: int | None = typer.Option(
        None, "--context", help="Max model length in tokens [default: the model's]."
    ),
    concurrency: int | None = typer.Option(
        None, "--concurrency",
        help="Sequences at full context each instance must hold [default: 1; engine "
             "max_num_seqs then stays at vLLM's default]. Not with --models (set it per "
             "model there).",
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
    models: Path | None = typer.Option(
        None, "--models",
        help="Plan several models on the fleet from this YAML file (see docs/planner.md, "
             "\"Several models\") instead of MODEL.",
    ),
    inventory: Path | None = typer.Option(
        None, "-i", "--inventory",
        help="With --models: the node names from this inventory's `inference` group, a "
             "check of the models it assigns them against the plan, and what it would "
             "override of the plan.",
    ),
    prefill_rate: float | None = typer.Option(
        None, "--prefill-rate",
        help="Prompt tokens/s one pipeline instance must take, for its network need "
             "[default: as many as it decodes].",
        show_default=False,
    ),
    decode_rate: float | None = typer.Option(
        None, "--decode-rate",
        help="Output tokens/s one pipeline instance must give [default: every sequence "
             "at --tpot-ms].",
        show_default=False,
    ),
    tpot_ms: float = typer.Option(
        DEFAULT_TPOT_MS, "--tpot-ms",
        help="Target time per output token (ms); a pipeline's network may take a tenth of it.",
    ),
    shared_prefix_tokens: int | None = typer.Option(
        None, "--shared-prefix-tokens",
        help="Tokens many requests share at their start (a tenant's system prompt, a "
             "document): the plan then says which load_balancer_routing suits them.",
        show_default=False,
    ),
    prefixes: int = typer.Option(
        1, "--prefixes", help="How many such shared prefixes are in use (tenants, documents)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
    write_vars: Path | None = typer.Option(
        None, "--write-vars",
        help="Write the roles' group_vars (YAML) to this file; with --models, to this "
             "inventory folder: models.yml (one group per model) and group_vars/<group>.yml.",
    ),
    endpoint_url: str | None = typer.Option(
        None, "--endpoint-url", envvar="AWS_ENDPOINT_URL", help="S3 endpoint for s3:// models."
    ),
) -> None:
    """Does the model fit the fleet, in which topology, with which engine settings."""
    targets = Targets(
        context=context,
        concurrency=concurrency,
        dtype=dtype,
        quantization=quantization,
        kv_cache_dtype=kv_cache_dtype,
        gpu_memory_utilization=gpu_memory_utilization,
        prefill_rate=prefill_rate,
        decode_rate=decode_rate,
        tpot_ms=tpot_ms,
    )
    for flag, value in (("--shared-prefix-tokens", shared_prefix_tokens), ("--prefixes", prefixes)):
        if value is not None and value < 1:
            raise _error(f"{flag} must be 1 or more, not {value}.")
    if models is not None:
        if shared_prefix_tokens is not None:
            raise _error("--shared-prefix-tokens works with one MODEL; with --models, plan "
                         "each model alone for its routing.")
        if model is not None:
            raise _error(f"give MODEL or --models, not both: list {model} in {models} instead.")
        if concurrency is not None:
            raise _error("--concurrency is per model with --models: set `concurrency` on each "
                         f"model in {models}.")
        _plan_fleet(models, inventory, gpus_per_node, gpu_memory_gib, nodes, targets,
                    as_json, write_vars, endpoint_url)
    if model is None:
        raise _error("give a MODEL to plan one model, or --models FILE to plan several.")
    if inventory is not None:
        raise _error("-i/--inventory works with --models only: list the model in a models "
                     "file, or drop -i.")
    try:
        source = load_model(model, endpoint_url=endpoint_url)
        plan = plan_model(
            source,
            Hardware(gpus_per_node=gpus_per_node, gpu_memory_gib=gpu_memory_gib,
                     nodes=1 if nodes is None else nodes),
            targets,
        )
    except PlannerError as err:
        raise _error(str(err)) from None
    routing = routing_advice(plan, shared_prefix_tokens, prefixes)
    if as_json:
        sys.stdout.write(json.dumps({**plan.to_dict(), "routing": routing}, indent=2) + "\n")
    else:
        render(plan, Console(), routing)
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


def _plan_fleet(models: Path, inventory: Path | None, gpus_per_node: int,
                gpu_memory_gib: float, nodes: int | None, defaults: Targets, as_json: bool,
                write_vars: Path | None, endpoint_url: str | None) -> None:
    """`plan --models`: always ends in typer.Exit with the exit code."""
    hosts, assignment = None, None
    try:
        entries = read_models_file(models, defaults)
        if inventory is not None:
            hosts, assignment = read_inventory(inventory)
            if nodes is not None and nodes != len(hosts):
                raise PlannerError(
                    f"--nodes {nodes} contradicts the inventory: its `inference` group has "
                    f"{len(hosts)} node(s); drop --nodes or fix the inventory."
                )
        hardware = Hardware(gpus_per_node=gpus_per_node, gpu_memory_gib=gpu_memory_gib,
                            nodes=len(hosts) if hosts else (1 if nodes is None else nodes))
        hardware.check()
        requests = []
        for entry in entries:
            try:
                source = load_model(entry["location"], endpoint_url=endpoint_url)
            except PlannerError as err:
                raise PlannerError(f"--models {models}: model {entry['name']}: {err}") from None
            requests.append(ModelRequest(entry["name"], source, entry["version"],
                                         entry["targets"], entry["concurrency"],
                                         entry["group"]))
        fleet = plan_fleet(hardware, requests, hosts)
    except (PlannerError, InventoryError) as err:
        raise _error(str(err)) from None
    checks = check_inventory(fleet, assignment) if assignment is not None else None
    files = fleet_files(fleet) if fleet.fits else None
    overrides = None
    try:
        if write_vars is not None and files is not None:
            check_fleet_target(write_vars, files)
        if inventory is not None and files is not None:
            overrides = plan_overrides(inventory, fleet, files, write_vars)
    except (PlannerError, InventoryError) as err:
        raise _error(str(err)) from None
    except OSError as err:
        raise _error(f"cannot read {err.filename or write_vars}: {err.strerror or err}"
                     ) from None
    if as_json:
        data = fleet.to_dict()
        if checks is not None:
            data["inventory_check"] = {"inventory": str(inventory),
                                       "models": [check.to_dict() for check in checks],
                                       "overridden": overrides}
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        render_fleet(fleet, Console(), checks, str(inventory) if inventory else None,
                     overrides)
    if files is None:
        if write_vars is not None:
            raise _error(f"the models do not fit, so nothing was written to {write_vars}.",
                         EXIT_DOES_NOT_FIT)
        raise typer.Exit(EXIT_DOES_NOT_FIT)
    if write_vars is not None:
        try:
            written = write_fleet_files(files, write_vars)
        except PlannerError as err:
            raise _error(str(err)) from None
        except OSError as err:
            raise _error(f"cannot write {err.filename or write_vars}: "
                         f"{err.strerror or err}") from None
        if not as_json:
            Console().print(f"wrote {', '.join(str(path) for path in written)}")
    raise typer.Exit(EXIT_FITS)
