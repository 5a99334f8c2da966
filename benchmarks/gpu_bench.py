"""The engine on the GPU, in one run: HBM floor, tokens/s against HF transformers,
the chunk-size sweep, and tp=2 / pp=2 parity. Writes JSON with the GPU and versions.

    PYTHONPATH=. python benchmarks/gpu_bench.py --json benchmarks/results/h200.json --plot-dir benchmarks/results

(a) copy bandwidth (a large device-to-device copy, bytes read + written) and the decode
    floor of each model (the bytes a decode step must read / that bandwidth), against
    our decode step at batch 1: the model runner's step in this process, and the
    engine's inter-token latency (scheduler, broadcast and reply included);
(b) output tokens/s at batch 1, 32 and 128, ours against HF `generate` on the same
    config and the same dummy weights, bf16;
(c) the max-num-batched-tokens sweep's TTFT and ITL (engine.bench.bench);
(d) with 2 GPUs: greedy tokens at tp=2 and at pp=2 against tp=1, fp32.

Each part is timed and its result (or its error) written as soon as it ends.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import statistics
import time
import traceback

import torch

from engine.bench.bench import Workload, measure, random_prompts, run_bench, sweep_configs, write_plot
from engine.communicator import Communicator, Layout
from engine.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.entrypoints.llm import LLM
from engine.model.config import ModelConfig
from engine.model.shard import Shard
from engine.model.loader import ModelSource, load_weights, resolve_model
from engine.sampling_params import SamplingParams
from engine.scheduler_output import NewRequest, RequestSampling, SchedulerOutput
from engine.worker.model_runner import ModelRunner

MODELS = ["llama-3.2-1b", "llama-3.1-8b"]
BATCHES = [1, 32, 128]
INPUT_LEN, OUTPUT_LEN = 128, 64          # the tokens/s comparison's workload
CONTEXT_LEN, DECODE_STEPS = 128, 64      # the runner's decode steps
RUNNER_BATCHES = [1, 128]
SWEEP = "max-num-batched-tokens=512,2048,8192"
SWEEP_WORKLOAD = Workload(num_prompts=64, input_len=1024, output_len=64, seed=0)
PARITY_MODEL, PARITY_TOKENS = "llama-3.2-1b", 32
PARITY_PROMPTS = ["Hello, my name is", "The capital of France is", "1 2 3 4", "A long prompt " * 20]
ENGINE_FLAGS = dict(max_model_len=2048, max_num_seqs=128, max_num_batched_tokens=8192)


def versions() -> dict:
    import transformers
    import triton
    return {"gpu": torch.cuda.get_device_name(), "gpu_count": torch.cuda.device_count(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
            "nccl": ".".join(map(str, _as_tuple(torch.cuda.nccl.version()))),
            "transformers": transformers.__version__}


def _as_tuple(version) -> tuple:
    return version if isinstance(version, tuple) else (version,)


def free_gpu() -> None:
    gc.collect()
    torch.cuda.empty_cache()


# -- (a) bandwidth and the decode floor ------------------------------------------------

def copy_bandwidth_gb_s(gib: int = 4) -> float:
    """A device-to-device copy of `gib` GiB of random bf16: bytes read + written / median time."""
    src = torch.randn(gib << 29, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    seconds = gpu_ms(lambda: dst.copy_(src), repeats=20) / 1e3
    nbytes = 2 * src.numel() * src.element_size()
    del src, dst
    free_gpu()
    return nbytes / seconds / 1e9


def decode_weight_bytes(cfg: ModelConfig, bytes_per_param: int = 2) -> int:
    """What one decode step must read: every layer's weights, the final norm and the LM
    head (the embedding table gives one row per token; tied, it is the LM head)."""
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    h, i = cfg.hidden_size, cfg.intermediate_size
    layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h
    return bytes_per_param * (cfg.num_layers * layer + h + cfg.vocab_size * h)


def runner_decode_step(model: str) -> dict:
    """This process's ModelRunner (CUDA graphs), with RUNNER_BATCHES requests of CONTEXT_LEN
    tokens of context each: per batch size, the median execute_model time of a decode step
    (inputs, graph replay, LM head, sampling) and of the graph replay alone (GPU time, no LM
    head); and, at batch 1, the GPU time of the step's matrix-vector products alone."""
    config = EngineConfig(model=model, max_num_seqs=max(RUNNER_BATCHES), seed=0)
    runner = ModelRunner(resolve_model(model), Communicator(Layout(1, 1), 0), torch.bfloat16,
                         torch.device("cuda", 0), config)
    blocks_per_seq = math.ceil((CONTEXT_LEN + DECODE_STEPS) / config.block_size)
    runner.init_kv_cache(blocks_per_seq * max(RUNNER_BATCHES))
    runner.warmup()
    report = {}
    for batch in RUNNER_BATCHES:
        step_times = decode_step_times(runner, batch, blocks_per_seq)
        graph = runner.decode_graphs.graphs[batch][0]
        report[batch] = {"runner_step_ms": statistics.median(step_times[8:]) * 1e3,
                         "graph_replay_ms": gpu_ms(graph.replay)}
    report["gemv_only_ms"] = gemv_only_ms(runner.model)
    del runner, graph
    free_gpu()
    return report


def greedy_batch(step: int, tokens: list[list[int]], block_ids: list[list[int]]) -> SchedulerOutput:
    """Greedy requests r0, r1, ... straight to a ModelRunner: at step 0 each whole sequence
    (a prefill) with the request itself, after that each one's last token."""
    req_ids = [f"r{b}" for b in range(len(tokens))]
    new = [seq if step == 0 else seq[-1:] for seq in tokens]
    fresh = [NewRequest(r, b, RequestSampling(0.0, 0, 1.0, None, 0))
             for r, b in zip(req_ids, block_ids)] if step == 0 else []
    return SchedulerOutput(step, req_ids, [len(seq) - len(n) for seq, n in zip(tokens, new)], new,
                           [True] * len(new), [[] for _ in new], fresh)


def decode_step_times(runner: ModelRunner, batch: int, blocks_per_seq: int) -> list[float]:
    """One prefill step for `batch` requests, then DECODE_STEPS - 1 timed decode steps."""
    tokens = torch.randint(0, 1000, (batch, CONTEXT_LEN)).tolist()
    block_ids = [list(range(b * blocks_per_seq, (b + 1) * blocks_per_seq)) for b in range(batch)]

    def step(n: int) -> float:
        batch_out = greedy_batch(n, tokens, block_ids)
        start = time.perf_counter()
        out = runner.execute_model(batch_out).output()
        elapsed = time.perf_counter() - start
        for seq, token in zip(tokens, out.sampled_token_ids):
            seq.append(token)
        return elapsed

    step(0)
    return [step(n) for n in range(1, DECODE_STEPS)]


def gpu_ms(fn, repeats: int = 50) -> float:
    """Median GPU time of fn() in milliseconds, by CUDA events, after 5 warm-up calls."""
    times = []
    for _ in range(repeats + 5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[5:])


def gemv_only_ms(model) -> float:
    """The batch-1 step's products with every layer's qkv, o, gate_up and down weights, as
    one CUDA graph: what the step would cost without its other (small) kernels."""
    weights = [linear.weight for layer in model.layers
               for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                              layer.mlp.gate_up_proj, layer.mlp.down_proj)]
    inputs = [torch.randn(1, w.shape[1], dtype=w.dtype, device=w.device) for w in weights]
    with torch.inference_mode():
        for x, w in zip(inputs, weights):
            torch.nn.functional.linear(x, w)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for x, w in zip(inputs, weights):
                torch.nn.functional.linear(x, w)
    return gpu_ms(graph.replay)


# -- (b) tokens/s, ours and HF's ---------------------------------------------------------

def engine_throughput(model: str) -> dict:
    """One engine, then a run per batch size: all requests at once, OUTPUT_LEN tokens each."""
    engine = LLMEngine(EngineConfig(model=model, **ENGINE_FLAGS))
    try:
        vocab = engine.model_config.vocab_size
        measure(engine, random_prompts(4, INPUT_LEN, vocab, seed=99), 4, "warmup")
        runs = {}
        for batch in BATCHES:
            result = measure(engine, random_prompts(batch, INPUT_LEN, vocab, seed=batch), OUTPUT_LEN, str(batch))
            runs[batch] = dataclasses.asdict(result)
        return runs
    finally:
        engine.shutdown()


class _HFParams:
    """HF's parameters as Shards, so that load_weights fills them with our dummy weights."""

    def __init__(self, model):
        self.model = model

    def weight_shards(self) -> list[Shard]:
        return [Shard(name, tuple(p.shape), None, 0, p.shape[0], p) for name, p in self.model.named_parameters()]


def hf_model(cfg: ModelConfig, device: str = "cuda"):
    import transformers
    config = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta, rope_scaling=cfg.rope_scaling,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=cfg.tie_word_embeddings,
        bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_ids[0], pad_token_id=0)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = transformers.LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default_dtype)
    with torch.no_grad():
        load_weights(_HFParams(model), ModelSource("dummy", None, cfg), seed=0)
    return model


def hf_throughput(model_name: str) -> dict:
    """HF `generate`, greedy, exactly OUTPUT_LEN new tokens per sequence."""
    cfg = resolve_model(model_name).model_config
    model = hf_model(cfg)

    def generate(batch: int, new_tokens: int) -> float:
        ids = torch.randint(0, cfg.vocab_size, (batch, INPUT_LEN), device="cuda")
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    generate(1, 4)
    runs = {}
    for batch in BATCHES:
        seconds = generate(batch, OUTPUT_LEN)
        runs[batch] = {"duration_s": seconds, "output_tokens_per_s": batch * OUTPUT_LEN / seconds}
    del model
    free_gpu()
    return runs


# -- (c) the chunk-size sweep ------------------------------------------------------------

def chunk_sweep(model: str, plot_dir: str | None) -> dict:
    config = EngineConfig(model=model, **ENGINE_FLAGS)
    results = [run_bench(run_config, SWEEP_WORKLOAD, label) for label, run_config in sweep_configs(config, SWEEP)]
    if plot_dir:
        write_plot(results, SWEEP, f"{plot_dir}/sweep-{model}.png")
    return {"sweep": SWEEP, "workload": dataclasses.asdict(SWEEP_WORKLOAD),
            "results": [dataclasses.asdict(r) for r in results]}


# -- (d) tp=2 and pp=2 against tp=1 -------------------------------------------------------

def parity() -> dict:
    params = SamplingParams(temperature=0.0, max_tokens=PARITY_TOKENS, ignore_eos=True)

    def tokens(**layout) -> list[list[int]]:
        with LLM(PARITY_MODEL, dtype="float32", max_model_len=1024, max_num_seqs=16, **layout) as llm:
            return [o.token_ids for o in llm.generate(PARITY_PROMPTS, params)]

    reference = tokens()
    report = {"model": PARITY_MODEL, "dtype": "float32", "tokens": PARITY_TOKENS}
    for name, layout in [("tp2", dict(tensor_parallel_size=2)), ("pp2", dict(pipeline_parallel_size=2))]:
        ours = tokens(**layout)
        report[name] = {"equal": ours == reference,
                        "first_difference": [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), None)
                                             for x, y in zip(ours, reference)]}
    return report


# -- the run -------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    parser.add_argument("--plot-dir", help="where to write each model's sweep plot (PNG)")
    parser.add_argument("--only", help="run only the parts whose names start so, comma-separated "
                                       "(copy_bandwidth, runner_decode, engine, hf, sweep, parity)")
    args = parser.parse_args()
    chosen = tuple(args.only.split(",")) if args.only else ("",)
    report: dict = {"versions": versions(), "seconds": {}, "errors": {}}

    def part(name: str, fn, *fn_args):
        if not name.startswith(chosen):
            return
        start = time.perf_counter()
        try:
            report[name] = fn(*fn_args)
        except Exception:
            report["errors"][name] = traceback.format_exc()
            print(f"[{name}] failed:\n{report['errors'][name]}", flush=True)
        free_gpu()
        report["seconds"][name] = round(time.perf_counter() - start, 1)
        print(f"[{name}] {report['seconds'][name]} s", flush=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)

    part("copy_bandwidth_gb_s", copy_bandwidth_gb_s)
    for model in MODELS:
        part(f"runner_decode/{model}", runner_decode_step, model)
        part(f"engine/{model}", engine_throughput, model)
        part(f"hf/{model}", hf_throughput, model)
    for model in MODELS:
        part(f"sweep/{model}", chunk_sweep, model, args.plot_dir)
    if torch.cuda.device_count() >= 2:
        part("parity", parity)
    report["summary"] = summary(report)
    with open(args.json, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report["summary"], indent=2))


def summary(report: dict) -> dict:
    """The ratios the issue asks for, from the parts that ran."""
    out = {}
    bandwidth = report.get("copy_bandwidth_gb_s")
    for model in MODELS:
        row = {}
        runner, engine, hf = (report.get(f"{kind}/{model}") for kind in ("runner_decode", "engine", "hf"))
        if bandwidth:
            floor_ms = decode_weight_bytes(resolve_model(model).model_config) / (bandwidth * 1e9) * 1e3
            row["floor_ms"] = floor_ms
            if runner:
                row["runner_step_ms"] = runner[1]["runner_step_ms"]
                row["runner_step_vs_floor"] = runner[1]["runner_step_ms"] / floor_ms
                row["graph_replay_ms"] = runner[1]["graph_replay_ms"]
                row["gemv_only_ms"] = runner["gemv_only_ms"]
                row["runner_step_ms_batch128"] = runner[128]["runner_step_ms"]
            if engine and engine[1]["itl_ms"]:
                row["engine_itl_p50_ms"] = engine[1]["itl_ms"]["p50"]
                row["engine_itl_vs_floor"] = engine[1]["itl_ms"]["p50"] / floor_ms
                row["engine_itl_p50_ms_batch128"] = engine[128]["itl_ms"]["p50"]
        for batch in BATCHES:
            if engine and hf:
                ours, theirs = engine[batch]["output_tokens_per_s"], hf[batch]["output_tokens_per_s"]
                row[f"tokens_per_s_batch{batch}"] = {"ours": ours, "hf": theirs, "ratio": ours / theirs}
        for run in report.get(f"sweep/{model}", {}).get("results", []):
            row[f"sweep_{run['label']}"] = {"ttft_ms": run["ttft_ms"], "itl_ms": run["itl_ms"],
                                            "output_tokens_per_s": run["output_tokens_per_s"]}
        out[model] = row
    return out


if __name__ == "__main__":
    main()
