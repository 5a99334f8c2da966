"""python -m engine {generate,serve,bench}."""
from __future__ import annotations

import argparse
import json
import signal
import sys

from engine.args import add_engine_args, config_from_args
from engine.bench import add_bench_args
from engine.executor import WorkerDiedError
from engine.loader import ModelError
from engine.node import NodeError, run_node


def _generate(args: argparse.Namespace) -> int:
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens, seed=args.request_seed,
                            stop=args.stop or [], ignore_eos=args.ignore_eos)
    params.validate()
    if not args.prompt:
        raise ValueError("generate needs at least one --prompt")
    if any(not p for p in args.prompt):
        raise ValueError("--prompt must not be empty")
    with LLM(**vars(config_from_args(args))) as llm:
        outputs = llm.generate(args.prompt, params)
    for prompt, out in zip(args.prompt, outputs):
        if args.json:
            print(json.dumps({"prompt": prompt, "text": out.text, "token_ids": out.token_ids,
                              "prompt_token_ids": out.prompt_token_ids,
                              "finish_reason": out.finish_reason}))
        else:
            print(f"{prompt!r} -> {out.text!r}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from engine.server import serve

    return serve(args)


def _bench(args: argparse.Namespace) -> int:
    from engine.bench import bench_main

    if args.sweep and args.nnodes > 1:
        raise ValueError("--sweep starts one engine per value; run multi-node benches one at a time")

    return bench_main(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text for prompts, offline")
    add_engine_args(gen)
    gen.add_argument("--prompt", action="append", help="repeatable; not needed with --node-rank > 0")
    gen.add_argument("--max-tokens", type=int, default=16)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--request-seed", type=int, default=None)
    gen.add_argument("--stop", action="append")
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--json", action="store_true", help="one JSON object per prompt")
    gen.set_defaults(run=_generate)
    srv = sub.add_parser("serve", help="serve the OpenAI API over HTTP")
    add_engine_args(srv)
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=8000, help="0: any free port")
    srv.add_argument("--served-model-name", help="the model name clients ask for (default: --model)")
    srv.set_defaults(run=_serve)
    bench = sub.add_parser("bench", help="offline throughput, TTFT and ITL, optionally swept over a flag")
    add_engine_args(bench)
    add_bench_args(bench)
    bench.set_defaults(run=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        if args.node_rank > 0:  # headless: this node's ranks only, until the head is done
            return run_node(config_from_args(args))
        return args.run(args)
    except (ValueError, ModelError, WorkerDiedError, NodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
