"""The driver's detokenizing through the engine on a GPU: the code before
engine/core/detokenizer.py (detokenize.py's `Before`) and now, in one call.

    PYTHONPATH=.:benchmarks python benchmarks/gpu_detokenize.py [--json FILE] [--budget-s 480]

Per model, one engine as `python -m engine bench --load-format dummy --dtype bfloat16
--input-len 128 --output-len 64`, all requests at once, at batch 1, 32 and 128; rounds
alternate which detokenizer the engine's new requests get. Per batch, the median over
rounds of each arm's ITL p50 and output tok/s, and ITL over the copy-bandwidth floor.
"""
from __future__ import annotations

import dataclasses
import statistics

from detokenize import Before
from gpu_bench import copy_bandwidth_gb_s, decode_weight_bytes, versions
from gpu_decode import ASYNC_AB_KV_BYTES, INPUT_LEN, MODEL_1B, MODEL_8B, Run, budget_options, engine_config

from engine.bench.bench import measure, random_prompts
from engine.core import llm_engine
from engine.core.detokenizer import Detokenizer

ARMS = {"before": Before, "now": Detokenizer}
BATCHES = [1, 32, 128]
OUTPUT_LEN = 64
ROUNDS = 5


def engine_ab(model: str, bandwidth_gb_s: float) -> dict:
    engine = llm_engine.LLMEngine(dataclasses.replace(engine_config(model),
                                                      kv_cache_memory_bytes=ASYNC_AB_KV_BYTES))
    try:
        vocab = engine.model_config.vocab_size
        floor_ms = decode_weight_bytes(engine.model_config) / (bandwidth_gb_s * 1e6)
        measure(engine, random_prompts(4, INPUT_LEN, vocab, seed=99), 4, "warmup")
        report = {"floor_ms": floor_ms}
        for batch in BATCHES:
            prompts = random_prompts(batch, INPUT_LEN, vocab, seed=batch)
            itl, tok_s = ({arm: [] for arm in ARMS} for _ in range(2))
            for round_ in range(ROUNDS):
                for arm in (list(ARMS) if round_ % 2 == 0 else list(ARMS)[::-1]):
                    llm_engine.Detokenizer = ARMS[arm]
                    result = measure(engine, prompts, OUTPUT_LEN, str(batch))
                    itl[arm].append(result.itl_ms.p50)
                    tok_s[arm].append(result.output_tokens_per_s)
            medians = {arm: statistics.median(values) for arm, values in itl.items()}
            report[batch] = {"itl_p50_ms": medians,
                             "x_floor": {arm: ms / floor_ms for arm, ms in medians.items()},
                             "output_tok_s": {arm: statistics.median(v) for arm, v in tok_s.items()},
                             "rounds": itl}
            print(f"  {model} batch {batch}: ITL p50 {medians}, floor {floor_ms:.3f} ms", flush=True)
        return report
    finally:
        llm_engine.Detokenizer = Detokenizer
        engine.shutdown()


def main() -> None:
    args = budget_options(__doc__, "gpu_detokenize", 480).parse_args()
    run = Run.of(args, "gpu_detokenize")
    run.part("versions", versions, needs_s=0)
    bandwidth = run.part("copy_bandwidth_gb_s", copy_bandwidth_gb_s, needs_s=10)
    for model in (MODEL_1B, MODEL_8B):
        run.part(f"engine/{model}", engine_ab, model, bandwidth, needs_s=90)


if __name__ == "__main__":
    main()
