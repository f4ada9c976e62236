"""GPU check: the planner's memory figures and the simulator's latency figures, measured.

memory   proves that the capacity planner (plugins/module_utils/planner) counts the bytes
         PyTorch really holds: a Llama-3.1-8B-shaped and a Qwen2.5-72B-shaped model built
         by transformers on the device (on CUDA as many layers as fit in ~60 % of free
         memory), in bf16 and with vLLM's online fp8 (float8_e4m3fn linears inside the
         decoder layers, one float32 scale each), and vLLM's KV-cache layout (one
         (2, blocks, 16, kv_heads, head_dim) bf16 tensor per layer). Every row must be
         within 1 % of the planner's figure.
profile  measures the figures of the simulated engine's Profile
         (roles/inference_engine/files/sim_engine.py) with hand-built decoder layers of
         the shape (fused qkv, RoPE, SDPA with GQA, SwiGLU, RMSNorm), timed over a few
         layers, scaled to the model's layer count, plus the lm_head; decode under CUDA
         graphs on CUDA, as vLLM runs it. Writes a profile the simulator loads.

    python3 measure.py memory --collections DIR --out OUTDIR [--device auto|cuda|cpu]
    python3 measure.py profile --out OUTDIR [--device auto|cuda|cpu]
                               [--shape llama-3.1-8b|qwen2.5-72b] --collections DIR

DIR holds ansible_collections/inferfleet/fleet (the collection). --device cpu, or no
CUDA, uses scaled-down shapes of the same structure, so a run takes seconds (the unit
tests). Exit 0: every row within 1 % / profile written; 1: a row off by more than 1 %;
2: an error that prevented measuring (the message says what). Needs torch (numpy comes
with it) and, for memory, transformers.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import platform
import re
import statistics
import sys
import time
import traceback
from functools import partial
from pathlib import Path
from types import SimpleNamespace

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as exc:  # main() reports it with exit 2
    torch, IMPORT_ERROR = None, exc

GiB = 1 << 30
SHAPES = {
    "llama-3.1-8b": dict(
        model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=4096,
        intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False, max_position_embeddings=131072, torch_dtype="bfloat16"),
    "qwen2.5-72b": dict(
        model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=8192,
        intermediate_size=29568, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8, vocab_size=152064, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False, max_position_embeddings=32768, use_sliding_window=False,
        torch_dtype="bfloat16"),  # Qwen2 always has q/k/v biases
}
# CPU: same structure, head_dim 64 kept, small enough for seconds on two cores
SMALL_LAYERS = {"llama-3.1-8b": 4, "qwen2.5-72b": 2}
SMALL_DIMS = dict(hidden_size=256, intermediate_size=896, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=4096)
# Known peaks: (HBM bytes/s, dense BF16 FLOP/s); anything else is "unknown"
PEAKS = {"H200": (4.8e12, 989e12), "H100 SXM": (3.35e12, 989e12)}


class Fail(Exception):
    """An error that prevented measuring: exit 2 with this message."""


def shape_config(shape: str, small: bool) -> dict:
    cfg = dict(SHAPES[shape])
    if small:
        cfg.update(SMALL_DIMS, num_hidden_layers=SMALL_LAYERS[shape])
    return cfg


def pick_device(name: str) -> str:
    if name == "cuda" and not torch.cuda.is_available():
        raise Fail("--device cuda, but torch.cuda.is_available() is False")
    dev = name if name != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if dev == "cpu":
        # One thread: a short run then often fits one scheduler time slice on a busy
        # machine, so the fastest of many runs is a clean one (clock()).
        torch.set_num_threads(1)
    return dev


def device_name(dev: str) -> str:
    if dev == "cuda":
        return torch.cuda.get_device_name()
    return f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"


def load_planner(collections: str) -> SimpleNamespace:
    root = Path(collections).resolve()
    pkg = root / "ansible_collections/inferfleet/fleet/plugins/module_utils/planner"
    if not (pkg / "weights.py").is_file():
        raise Fail(f"--collections {collections}: no planner at {pkg} (DIR must hold "
                   "ansible_collections/inferfleet/fleet)")
    sys.path.insert(0, str(root))
    from ansible_collections.inferfleet.fleet.plugins.module_utils.planner import (
        architecture,
        memory,
        plan,
        weights,
    )
    return SimpleNamespace(parse=architecture.parse_architecture, build=weights.build_weights,
                           role=weights.tensor_role, kv=memory.kv_bytes_per_token,
                           block=memory.GPU_BLOCK_SIZE, plan_config=plan.plan_config,
                           Hardware=plan.Hardware, Targets=plan.Targets)


def settle(dev: str) -> None:
    gc.collect()
    if dev == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def held_bytes(dev: str, base: int, tensors) -> int:
    """CUDA: memory_allocated() above base; CPU: unique untyped storages of ``tensors``."""
    if dev == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated() - base
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def to_fp8(model, role) -> int:
    """vLLM's online fp8: each linear the planner quantizes becomes float8_e4m3fn plus a
    float32 per-tensor scale. Returns how many were converted."""
    fmax, done = torch.finfo(torch.float8_e4m3fn).max, 0
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and role(name + ".weight") in {"linear", "expert"}:
            scale = (mod.weight.detach().abs().amax().float() / fmax).clamp(min=1e-12)
            q = (mod.weight.detach().float() / scale).to(torch.float8_e4m3fn)
            mod.weight = torch.nn.Parameter(q, requires_grad=False)
            mod.weight_scale = torch.nn.Parameter(scale.reshape(1), requires_grad=False)
            done += 1
    return done


def memory(args) -> int:
    import transformers

    pl = load_planner(args.collections)
    dev = pick_device(args.device)
    method = ("torch.cuda.memory_allocated() delta" if dev == "cuda"
              else "sum of unique untyped storages (parameters and buffers / KV tensors)")
    dtype_kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    fp8 = hasattr(torch, "float8_e4m3fn")
    rows, configs, notes = [], {}, []
    free = torch.cuda.mem_get_info()[0] if dev == "cuda" else 0
    for shape in SHAPES:
        cfg = shape_config(shape, small=dev == "cpu")
        if dev == "cuda":  # as many layers as fit in 60 % of free memory
            while pl.build(pl.parse(cfg), None, "bfloat16").total_bytes > 0.6 * free:
                if cfg["num_hidden_layers"] == 1:
                    raise Fail(f"{shape}: one layer does not fit 60 % of {free / GiB:.1f} GiB")
                cfg["num_hidden_layers"] -= 1
        config = transformers.AutoConfig.for_model(**cfg)
        configs[shape] = config_dict = json.loads(config.to_json_string())
        arch = pl.parse(config_dict)
        layers = arch.num_layers

        def row(what, planned, measured, shape=shape, layers=layers):
            ratio = measured / planned
            rows.append(dict(shape=shape, what=what, layers=layers, planner_bytes=planned,
                             measured_bytes=measured, ratio=round(ratio, 6),
                             within_1pct=abs(ratio - 1) <= 0.01, method=method))

        settle(dev)
        base = torch.cuda.memory_allocated() if dev == "cuda" else 0
        with torch.device(dev):
            model = transformers.AutoModelForCausalLM.from_config(
                config, **{dtype_kw: torch.bfloat16}).to(dev)  # .to: a no-op unless ignored

        def tensors(model=model):
            return [*model.parameters(), *model.buffers()]

        row("weights_bf16", pl.build(arch, None, "bfloat16").total_bytes,
            held_bytes(dev, base, tensors()))
        if fp8:
            with torch.no_grad():
                converted = to_fp8(model, pl.role)
            settle(dev)
            row("weights_fp8", pl.build(arch, None, "bfloat16", "fp8").total_bytes,
                held_bytes(dev, base, tensors()))
            notes.append(f"{shape}: {converted} linears to fp8 (the planner's 'linear' role: "
                         "decoder layers only; embeddings, lm_head, norms, biases stay bf16)")
        del model, tensors
        settle(dev)
        per_token = pl.kv(arch, 2)
        free_now = torch.cuda.mem_get_info()[0] if dev == "cuda" else 0
        blocks = int(0.2 * free_now // (pl.block * per_token)) if dev == "cuda" else 1024
        base = torch.cuda.memory_allocated() if dev == "cuda" else 0
        kv = [torch.empty((2, blocks, pl.block, arch.num_kv_heads, arch.head_dim),
                          dtype=torch.bfloat16, device=dev) for _ in range(layers)]
        measured = held_bytes(dev, base, kv) / (blocks * pl.block)
        row("kv_per_token", per_token, measured)
        rows[-1]["kv_blocks"] = blocks
        del kv
        settle(dev)
    if not fp8:
        notes.append("torch has no float8_e4m3fn: no fp8 rows")
    out = dict(device=device_name(dev), torch=torch.__version__,
               transformers=transformers.__version__, method=method, rows=rows,
               configs=configs, notes=notes)
    (Path(args.out) / "memory.json").write_text(json.dumps(out, indent=2) + "\n")
    for r in rows:
        print(f"{r['shape']:13} {r['what']:13} layers={r['layers']:<3} "
              f"planner={r['planner_bytes']:>15,} measured={r['measured_bytes']:>17,.1f} "
              f"ratio={r['ratio']:.5f} {'ok' if r['within_1pct'] else 'OFF'}")
    print(f"method: {method}; {out['device']}, torch {torch.__version__}")
    return 0 if all(r["within_1pct"] for r in rows) else 1


def clock(fn, cuda: bool, graph: bool) -> tuple[float, bool]:
    """Milliseconds of ``fn``: on CUDA the median of CUDA events, under a CUDA graph when
    ``graph`` (eager if capture fails); on CPU the fastest of many perf_counter runs
    (at least 5, for about half a second), since on a shared machine other work only
    ever adds time. Returns (ms, graphed)."""
    if not cuda:
        fn()  # warm-up
        times, began = [], time.perf_counter()
        while len(times) < 5 or (len(times) < 200 and time.perf_counter() - began < 0.5):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return min(times), False
    if graph:
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(stream)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            fn = g.replay
        except RuntimeError:
            graph = False
    times = []
    for i in range(23):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        if i >= 3:  # warm-up first
            times.append(start.elapsed_time(end))
    return statistics.median(times), graph


def relative_fit(rows, ms) -> np.ndarray:
    """Least squares of the relative error: timing noise grows with the time measured, and
    the small points (which fix the constant terms) count as much as the large ones."""
    w = 1 / np.asarray(ms)
    return np.linalg.lstsq(np.asarray(rows) * w[:, None], np.asarray(ms) * w, rcond=None)[0]


def kv_blocks(cfg, total: int, pl) -> tuple[int, str]:
    """The profile's KV cache on this GPU: the planner's figure."""
    gib = f"0.9 x {total / GiB:.1f} GiB"
    for tp in (1, 2, 4, 8):
        layout = pl.plan_config(cfg, pl.Hardware(tp, total / GiB),
                                pl.Targets(gpu_memory_utilization=0.9)).evaluated[0]
        if layout.capacity.num_blocks > 0:
            where = "" if tp == 1 else f" at TP {tp} (it does not fit one GPU; timings are TP 1)"
            return layout.capacity.num_blocks, (
                f"kv_blocks: the planner's{where}, {gib} less the weights and its overhead "
                f"reserve, at {layout.kv_bytes_per_token} bytes per token")
    raise Fail(f"the planner leaves no KV cache for {cfg['architectures'][0]} up to TP 8")


def profile(args) -> int:
    pl = load_planner(args.collections)  # a wrong folder fails at once, on CPU too
    dev = pick_device(args.device)
    cuda = dev == "cuda"
    cfg = shape_config(args.shape, small=not cuda)
    h, nh, kvh = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    inter, n_layers, eps = cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["rms_norm_eps"]
    hd, dt, timed = h // nh, torch.bfloat16, min(n_layers, 4 if cuda else 2)
    torch.manual_seed(0)

    def weight(*shape, scale=None):
        return torch.randn(*shape, device=dev, dtype=dt) * (scale or shape[-1] ** -0.5)

    qkv = (nh + 2 * kvh) * hd
    layers = [dict(qkv=weight(qkv, h), o=weight(h, nh * hd), gate_up=weight(2 * inter, h),
                   down=weight(h, inter), n1=weight(h, scale=1), n2=weight(h, scale=1))
              for _ in range(timed)]
    for lyr in layers if cfg["model_type"] == "qwen2" else ():
        lyr["qkv_b"] = weight(qkv, scale=0.01)
    norm, lm_head = weight(h, scale=1), weight(cfg["vocab_size"], h)
    inv_freq = 1.0 / cfg["rope_theta"] ** (torch.arange(0, hd, 2, device=dev) / hd)

    def rot(x, cos, sin):  # RoPE, rotate-half form
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def run_layers(x, caches, cos, sin):
        b, t, _ = x.shape
        for lyr, cache in zip(layers, caches, strict=True):
            y = F.linear(F.rms_norm(x, (h,), lyr["n1"], eps), lyr["qkv"], lyr.get("qkv_b"))
            q, k, v = (z.view(b, t, -1, hd).transpose(1, 2)
                       for z in y.split([nh * hd, kvh * hd, kvh * hd], dim=-1))
            q, k = rot(q, cos, sin), rot(k, cos, sin)
            if cache is None:  # prefill: causal attention over the prompt
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:  # decode: write the new token's K/V, attend over the whole context
                cache[0][:, :, -1:].copy_(k)
                cache[1][:, :, -1:].copy_(v)
                a = F.scaled_dot_product_attention(q, cache[0], cache[1], enable_gqa=True)
            x = x + F.linear(a.transpose(1, 2).reshape(b, t, nh * hd), lyr["o"])
            g, u = F.linear(F.rms_norm(x, (h,), lyr["n2"], eps), lyr["gate_up"]).chunk(2, -1)
            x = x + F.linear(F.silu(g) * u, lyr["down"])
        return x

    def run_head(x):  # logits of each sequence's last token
        return F.linear(F.rms_norm(x[:, -1], (h,), norm, eps), lm_head)

    layer_params = sum(t.numel() for t in layers[0].values())
    step_bytes = 2 * (layer_params * n_layers + lm_head.numel() + h)  # read per decode step
    name = device_name(dev)
    known = "H200" if "H200" in name else (
        "H100 SXM" if "H100" in name and ("SXM" in name or "HBM3" in name) else None)
    peak = PEAKS.get(known)
    if cuda:  # before the timings: a failure here should not waste them
        total = torch.cuda.get_device_properties(0).total_memory
        blocks, blocks_note = kv_blocks(cfg, total, pl)
    else:
        blocks, blocks_note = 4096, "kv_blocks: a fixed 4096 (a CPU run has no GPU memory)"
    batches, contexts = ((1, 8, 32, 128), (512, 2048)) if cuda else ((1, 4, 16), (128, 512))
    cases = [("decode", b, c) for c in contexts for b in batches]
    cases += [("prefill", 1, t) for t in ((256, 1024, 4096) if cuda else (256, 1024, 2048))]
    points, graphed = [], cuda
    with torch.inference_mode():
        for kind, b, n in cases:
            dec = kind == "decode"
            x = torch.randn(b, 1 if dec else n, h, device=dev, dtype=dt)
            caches = ([[torch.zeros(b, kvh, n, hd, device=dev, dtype=dt) for _ in "kv"]
                       for _ in layers] if dec else [None] * timed)
            angle = (torch.arange(n - 1 if dec else 0, n, device=dev)[:, None] * inv_freq)
            cos, sin = angle.cos().to(dt), angle.sin().to(dt)
            t_layers, g1 = clock(partial(run_layers, x, caches, cos, sin), cuda, cuda and dec)
            t_head, g2 = clock(partial(run_head, x), cuda, cuda and dec)
            graphed = graphed and (g1 and g2 or not dec)
            floor = "unknown" if not peak else 1e3 * (
                step_bytes / peak[0] if dec else 2 * layer_params * n_layers * n / peak[1])
            points.append(dict(kind=kind, batch=b, **{"context" if dec else "tokens": n},
                               layers_ms=t_layers, head_ms=t_head,
                               ms=t_layers * n_layers / timed + t_head, floor_ms=floor))
            del x, caches
            settle(dev)
    decode = [p for p in points if p["kind"] == "decode"]
    prefill = [p for p in points if p["kind"] == "prefill"]
    d_fit = relative_fit([[1, p["batch"], p["batch"] * p["context"] / 1000] for p in decode],
                         [p["ms"] for p in decode])
    p_fit = relative_fit([[1, p["tokens"]] for p in prefill], [p["ms"] for p in prefill])
    fitted = dict(prefill_overhead_ms=p_fit[0], prefill_per_token_ms=p_fit[1],
                  decode_base_ms=d_fit[0], decode_per_seq_ms=d_fit[1],
                  decode_per_1k_context_ms=d_fit[2])
    clamped = [f"{k} fitted {v:.4g}, clamped to 0" for k, v in fitted.items() if v < 0]
    fitted = {k: max(0.0, float(f"{v:.4g}")) for k, v in fitted.items()}
    short = re.sub(r"[^a-z0-9.]+", "-", (known or name).lower().removeprefix("nvidia ")).strip("-")
    family = args.shape.split("-")[0].rstrip("0123456789.")
    source = (
        f"Measured by scripts/gpu-check/measure.py on {name}, torch {torch.__version__}, "
        f"{datetime.date.today().isoformat()}: {args.shape}-shaped decoder ({n_layers} layers, "
        f"hidden {h}, {nh}/{kvh} heads, bf16{'' if cuda else ', scaled down for CPU'}); "
        f"{timed} hand-built layers timed and scaled to {n_layers}, plus the lm_head"
        f"{' (decode under CUDA graphs)' if graphed else ''}. Decode: " + "; ".join(
            f"B={p['batch']} C={p['context']}: {p['ms']:.3g} ms" for p in decode)
        + ". Prefill of one sequence: " + "; ".join(
            f"T={p['tokens']}: {p['ms']:.3g} ms" for p in prefill)
        + ". Least squares of the relative error: "
        "decode = base + per_seq x B + per_1k_context x B x C / 1000, "
        f"prefill = overhead + per_token x T (nothing subtracted). {blocks_note}."
        + "".join(f" {c}." for c in clamped))
    prof = dict(name=f"{short}-{args.shape}" if cuda else f"cpu-small-{family}", source=source,
                block_size=16, kv_blocks=blocks, max_num_seqs=256, **fitted)
    out = Path(args.out)
    (out / f"profile-{args.shape}.json").write_text(json.dumps(prof, indent=2) + "\n")
    ceilings = "unknown" if not peak else dict(
        device=known, hbm_bytes_per_s=peak[0], dense_bf16_flops=peak[1],
        decode_floor_ms=step_bytes / peak[0] * 1e3,
        prefill_floor_per_token_ms=2 * layer_params * n_layers / peak[1] * 1e3)
    default = simulator_default(args.collections)
    points_out = dict(device=name, torch=torch.__version__, dtype="bfloat16", config=cfg,
                      simulator_default=default,
                      timed_layers=timed, decode_cuda_graphs=graphed, points=points,
                      ceilings=ceilings, bytes_read_per_decode_step=step_bytes, fit=fitted,
                      clamped=clamped, kv_blocks=blocks, kv_blocks_note=blocks_note)
    (out / f"profile-{args.shape}.points.json").write_text(json.dumps(points_out, indent=2))
    for p in points:
        what = f"B={p['batch']:<4} C={p['context']:<5}" if "context" in p else f"T={p['tokens']}"
        floor = "unknown" if not peak else f"{p['floor_ms']:.3f} ms"
        print(f"{p['kind']:8} {what:13} {p['ms']:9.3f} ms  floor {floor}")
    print(f"{prof['name']}: {json.dumps(fitted)}, kv_blocks {blocks}")
    if default:
        print(f"{default['name']} (the simulator's default): "
              + json.dumps({k: default[k] for k in fitted}) + f", kv_blocks {default['kv_blocks']}")
    return 0


def simulator_default(collections) -> dict | None:
    """The simulator's shipped default profile (from the collection), to set beside the
    measured one."""
    role = Path(collections) / "ansible_collections/inferfleet/fleet/roles/inference_engine"
    named = re.search(r"^inference_engine_sim_profile: *(\S+)",
                      (role / "defaults/main.yml").read_text(), re.M)
    path = role / "files/sim_profiles" / f"{named.group(1)}.json" if named else None
    return json.loads(path.read_text()) if path and path.is_file() else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    mem = sub.add_parser("memory", help="planner bytes against PyTorch's (exit 1 if > 1 %% off)")
    mem.add_argument("--collections", required=True,
                     help="folder holding ansible_collections/inferfleet/fleet")
    prof = sub.add_parser("profile", help="measure the simulated engine's Profile figures")
    prof.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-8b")
    prof.add_argument("--collections", required=True,
                      help="as for memory: kv_blocks from the planner (CUDA), the default profile")
    for p in (mem, prof):
        p.add_argument("--out", required=True, help="folder for the JSON results")
        p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    args = parser.parse_args(argv)
    if torch is None:
        print(f"error: {IMPORT_ERROR}; measure.py needs torch and numpy", file=sys.stderr)
        return 2
    try:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        return memory(args) if args.command == "memory" else profile(args)
    except Fail as exc:
        print(f"error: {exc}", file=sys.stderr)
    except Exception:  # a failed measurement (out of memory, a missing package): say what
        traceback.print_exc()
        print(f"error: {args.command} could not measure (traceback above)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
