"""The decode path's kernels closer to the floor, before and after, in one GPU call: products
of 2 to 32 rows on the matrix units (kernels/small_batch.py) rather than cuBLAS, and
decode attention in tiles of 64 keys. "Before" is ENGINE_SMALL_BATCH=0
ENGINE_DECODE_KEY_TILE=32.

    PYTHONPATH=.:benchmarks python benchmarks/gpu_small_batch.py [--parts products,attention,...]
        [--json FILE] [--budget-s 480]

(a) copy bandwidth and each model's decode floor (gpu_bench.py's);
(b) products: each of the 8B's products alone at batch 8, 32 and 128, cuBLAS (then
    silu_and_mul's kernel for gate/up) against small_batch_matmul at several tiles: a
    CUDA graph over every layer's own weight per path, GPU us per layer, and the largest
    difference from cuBLAS;
(c) attention: the decode attention kernel alone at each model's shapes, batch 32 and 128
    at a context of 192 (and 32 at 1000), at several key tiles and launch settings, each
    context whole and split in two: a CUDA graph of one call a layer, each layer its own
    cache, GPU us per call;
(d) graphs: per model, the decode graphs' GPU time at batch 1 to 32 before and after;
(e) engine: through the engine, as `python -m engine bench --load-format dummy --dtype
    bfloat16 --input-len 128 --output-len 64` with all requests at once: two engines per
    model side by side, before and after, rounds alternating which goes first
    (gpu_gemv_fold.py's engine_ab), with their greedy tokens for gpu_decode's parity prompts;
(f) probe: the probe's cost per decode step, after: gpu_decode's in-process A/B over the
    8B runner at batch 1, synchronous and pipelined steps; and the decode graphs' GPU
    time before and after.
"""
from __future__ import annotations

import dataclasses
import math
import os
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from gpu_bench import copy_bandwidth_gb_s, versions
from gpu_decode import INPUT_LEN, MODEL_1B, MODEL_8B, Plan, Run, budget_options, graph_ms, graph_of, num
from gpu_gemv_fold import engine_ab, print_summary, runner_graphs, summary

from engine.communicator import Communicator, Layout
from engine.config import EngineConfig
from engine.model import kernel_flags
from engine.model.attention import AttentionMetadata
from engine.model.loader import resolve_model
from engine.worker.model_runner import ModelRunner
from kernels import attention as attention_kernels
from kernels.activation import silu_and_mul
from kernels.attention import Launch
from kernels.small_batch import Tile, small_batch_matmul

PRODUCT_BATCHES = [8, 32, 128]
ATTENTION_CASES = [(32, 192), (128, 192), (32, 1000)]
ATTENTION_LAUNCHES = [Launch(key_tile, warps, stages) for key_tile in (32, 64) for warps in (4, 8)
                      for stages in (2, 3, 4)]
BLOCK_SIZE = 16
TILES = [Tile(16, 256, 4, 4), Tile(32, 256, 4, 4), Tile(32, 128, 4, 6), Tile(64, 128, 4, 4),
         Tile(64, 256, 8, 3), Tile(128, 128, 8, 3)]


@dataclass
class Switch:
    """An environment variable the workers read at start, and the attribute this process
    reads at every launch: (value of each) on and off."""
    env_var: str
    module: object
    name: str
    on: tuple
    off: tuple


SWITCHES = {
    "small_batch": Switch("ENGINE_SMALL_BATCH", kernel_flags, "SMALL_BATCH", ("1", True), ("0", False)),
    "decode_key_tile": Switch("ENGINE_DECODE_KEY_TILE", attention_kernels, "WHOLE_CONTEXT_DECODE",
                              ("64", Launch(key_tile=64)), ("32", Launch(key_tile=32))),
}


@contextmanager
def switched(on_names):
    """Each switch on if named, else off; restored after."""
    with ExitStack() as stack:
        for name, switch in SWITCHES.items():
            env, value = switch.on if name in on_names else switch.off
            stack.enter_context(_set(switch, env, value))
        yield


@contextmanager
def _set(switch: Switch, env: str, value):
    saved_env, saved = os.environ.get(switch.env_var), getattr(switch.module, switch.name)
    os.environ[switch.env_var] = env
    setattr(switch.module, switch.name, value)
    try:
        yield
    finally:
        setattr(switch.module, switch.name, saved)
        if saved_env is None:
            os.environ.pop(switch.env_var, None)
        else:
            os.environ[switch.env_var] = saved_env


def all_changes(on: bool):
    return switched(SWITCHES if on else ())


def graph_arms(model: str) -> dict:
    """Decode graph GPU ms per arm and batch size (the graphs' own one-token context)."""
    config = EngineConfig(model=model, max_num_seqs=32, max_model_len=INPUT_LEN + 64, seed=0)
    runner = ModelRunner(resolve_model(model, "dummy"), Communicator(Layout(1, 1), 0), torch.bfloat16,
                         torch.device("cuda", 0), config)
    runner.init_kv_cache(64)
    report = {}
    for arm, on in (("before", False), ("after", True)):
        with all_changes(on):
            report[arm] = graph_ms(runner, [1, 2, 8, 32])
    print(f"  {model} decode graph ms: {report}", flush=True)
    del runner
    return report


def tile_name(tile: Tile) -> str:
    return f"n{tile.block_n}_k{tile.block_k}_w{tile.num_warps}_s{tile.num_stages}"


def products_alone(model: str, bandwidth_gb_s: float) -> dict:
    """us per layer of each product, cuBLAS and each tile, at each batch size."""
    cfg = resolve_model(model, "dummy").model_config
    h = cfg.hidden_size
    products = {"qkv": ((cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, h, False),
                "o": (h, cfg.num_heads * cfg.head_dim, False),
                "gate_up": (2 * cfg.intermediate_size, h, True),
                "down": (h, cfg.intermediate_size, False)}
    report = {}
    for name, (rows, k, silu) in products.items():
        weights = [torch.randn(rows, k, dtype=torch.bfloat16, device="cuda") / k ** 0.5
                   for _ in range(cfg.num_layers)]
        report[name] = {"floor_us": weights[0].numel() * 2 / (bandwidth_gb_s * 1e3)}
        for batch in PRODUCT_BATCHES:
            x = torch.randn(batch, k, dtype=torch.bfloat16, device="cuda")
            paths = {"cublas": lambda w: silu_and_mul(F.linear(x, w)) if silu else F.linear(x, w)}
            paths.update({tile_name(t): lambda w, t=t: small_batch_matmul(x, w, silu, t) for t in TILES})
            reference = paths["cublas"](weights[0]).float()
            row = {}
            for path, fn in paths.items():
                difference = ((fn(weights[0]).float() - reference).abs().max() / reference.abs().max()).item()
                row[path] = {"us_per_layer": graph_of(fn, weights) * 1e3 / len(weights),
                             "max_rel_difference": difference}
            report[name][batch] = row
            best = min((p for p in row if p != "cublas"), key=lambda p: row[p]["us_per_layer"])
            print(f"  {model} {name} ({rows}, {k}) batch {batch}: floor {report[name]['floor_us']:.1f}, "
                  f"cublas {row['cublas']['us_per_layer']:.1f}, best {best} {row[best]['us_per_layer']:.1f} "
                  f"({row[best]['max_rel_difference']:.1e})", flush=True)
        del weights
    return report


@contextmanager
def splits_forced(splits: int, programs: int):
    """decode_splits as if the GPU had programs * splits SMs: `splits` ranges a context."""
    saved = attention_kernels.program_target
    attention_kernels.program_target = lambda device: programs * splits if splits > 1 else saved(device)
    try:
        yield
    finally:
        attention_kernels.program_target = saved


def attention_alone(model: str) -> dict:
    cfg = resolve_model(model, "dummy").model_config
    heads, kv_heads, head_dim, layers = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.num_layers
    report = {}
    for batch, context in ATTENTION_CASES:
        blocks = math.ceil((context + 1) / BLOCK_SIZE)
        shape = (batch * blocks + 1, BLOCK_SIZE, kv_heads, head_dim)
        caches = [(torch.randn(shape, dtype=torch.bfloat16, device="cuda"),
                   torch.randn(shape, dtype=torch.bfloat16, device="cuda")) for _ in range(layers)]
        tables = torch.randperm(batch * blocks, device="cuda").view(batch, blocks).to(torch.int32)
        meta = AttentionMetadata(
            slot_mapping=torch.zeros(batch, dtype=torch.int64, device="cuda"),
            query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device="cuda"),
            seq_lens=torch.full((batch,), context + 1, dtype=torch.int32, device="cuda"),
            block_tables=tables, max_query_len=1, max_seq_len=131072)   # a decode graph's capacity
        q = torch.randn(batch, heads, head_dim, dtype=torch.bfloat16, device="cuda")
        row, reference = {}, None
        for launch in ATTENTION_LAUNCHES:
            for splits in (1, 2):
                def call(cache, launch=launch):
                    return attention_kernels.paged_attention(q, *cache, meta, head_dim ** -0.5, launch)
                with splits_forced(splits, batch * kv_heads):
                    out = call(caches[0]).float()
                    reference = out if reference is None else reference
                    name = f"k{launch.key_tile}_w{launch.num_warps}_s{launch.num_stages}_split{splits}"
                    row[name] = {"us": graph_of(call, caches) * 1e3 / layers,
                                 "max_rel_difference": ((out - reference).abs().max()
                                                        / reference.abs().max()).item()}
        kv_bytes = 2 * batch * (context + 1) * kv_heads * head_dim * 2
        best = min(row, key=lambda name: row[name]["us"])
        report[f"{batch}x{context}"] = {"kv_floor_us": kv_bytes / 4.2e6, "launches": row}
        print(f"  {model} attention batch {batch} context {context}: default "
              f"{row['k32_w4_s3_split1']['us']:.1f} us, best {best} {row[best]['us']:.1f} us, "
              f"KV floor {kv_bytes / 4.2e6:.1f} us", flush=True)
        del caches
    return report


def main() -> None:
    parser = budget_options(__doc__, "gpu_small_batch", 480)
    parser.add_argument("--parts", default="products,attention,graphs,engine,probe")
    args = parser.parse_args()
    parts = args.parts.split(",")
    run = Run.of(args, "gpu_small_batch")
    run.part("versions", versions, needs_s=0)
    bandwidth = run.part("copy_bandwidth_gb_s", copy_bandwidth_gb_s, needs_s=10)
    if "products" in parts:
        run.part(f"matmul/{MODEL_8B}", products_alone, MODEL_8B, bandwidth, needs_s=30)
    if "attention" in parts:
        for model in (MODEL_8B, MODEL_1B):
            run.part(f"attention/{model}", attention_alone, model, needs_s=30)
    if "graphs" in parts:
        for model in (MODEL_8B, MODEL_1B):
            run.part(f"graphs/{model}", graph_arms, model, needs_s=40)
    if "engine" in parts:
        for model in (MODEL_8B, MODEL_1B):
            run.part(f"engine/{model}", engine_ab, model, all_changes, needs_s=90)
    if "probe" in parts:
        probe_plan = dataclasses.replace(Plan.of(False), probe_rounds=30)
        run.part(f"runner/{MODEL_8B}", runner_graphs, MODEL_8B, all_changes, probe_plan, needs_s=60)
    run.report["summary"] = summary(run.report)
    run.write()
    print_summary(run.report)
    for product, row in (run.report.get(f"matmul/{MODEL_8B}") or {}).items():
        for batch in PRODUCT_BATCHES:
            cells = row[batch]
            best = min((p for p in cells if p != "cublas"), key=lambda p: cells[p]["us_per_layer"])
            print(f"{product} batch {batch}: floor {row['floor_us']:.1f} us, cublas "
                  f"{num(cells['cublas']['us_per_layer'], '.1f')}, best {best} "
                  f"{num(cells[best]['us_per_layer'], '.1f')}")
    print(f"wrote {run.path}", flush=True)


if __name__ == "__main__":
    main()
