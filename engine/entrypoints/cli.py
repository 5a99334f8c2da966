"""python -m engine {generate,serve,bench}.

Every flag is checked before torch and the engine are imported: a bad command line
is answered in a fraction of a second, not after seconds of imports."""
from __future__ import annotations

import argparse
import json
import signal
import sys
from importlib import metadata

from engine.entrypoints.args import add_bench_args, add_engine_args, config_from_args, human_int
from engine.entrypoints.openai_protocol import IDLE_TIMEOUT_S, MAX_PROMPT_CHARS
from engine.entrypoints.vllm_flags import dashed, leftover_flags
from engine.errors import EngineError
from engine.model.config import ModelError
from engine.sampling_params import SamplingParams

NO_MODEL = ("no model given: python -m engine serve MODEL, where MODEL is a HF model directory, "
            "a .gguf file, smollm2-135m (the embedded real weights) or a named config with random "
            "weights such as tiny-llama")


class _Parser(argparse.ArgumentParser):
    """argparse's errors in one line (no usage block), exit code 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _generate(args: argparse.Namespace) -> int:
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens, seed=args.request_seed,
                            stop=args.stop or [], ignore_eos=args.ignore_eos)
    params.validate()
    if not args.prompt:
        raise ValueError("generate needs at least one --prompt")
    if any(not p for p in args.prompt):
        raise ValueError("--prompt must not be empty")
    from engine.entrypoints.llm import LLM

    with LLM(**vars(config_from_args(args))) as llm:
        outputs = llm.generate(args.prompt, params)
        random_weights = llm.engine.random_weights
    if random_weights and not args.json:
        print(f"{args.model}: random weights, so the tokens below are shown as ids (their text "
              f"is noise); --model smollm2-135m has real ones", file=sys.stderr)
    for prompt, out in zip(args.prompt, outputs):
        if args.json:
            print(json.dumps({"prompt": prompt, "text": out.text, "token_ids": out.token_ids,
                              "prompt_token_ids": out.prompt_token_ids,
                              "finish_reason": out.finish_reason}))
        elif random_weights:
            print(f"{prompt!r} -> token ids {out.token_ids}")
        else:
            print(f"{prompt!r} -> {out.text!r}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from engine.entrypoints.server import serve

    return serve(args)


def _bench(args: argparse.Namespace) -> int:
    from engine.bench.bench import bench_main

    if args.sweep and args.nnodes > 1:
        raise ValueError("--sweep starts one engine per value; run multi-node benches one at a time")

    return bench_main(args, config_from_args(args))


def _version() -> str:
    try:
        return metadata.version("hangscope")
    except metadata.PackageNotFoundError:
        return "(not installed: run from a checkout)"


def _add_generate(sub) -> argparse.ArgumentParser:
    gen = sub.add_parser("generate", help="generate text for prompts, offline")
    add_engine_args(gen)
    a = gen.add_argument
    a("--prompt", action="append", help="repeatable; not needed with --node-rank > 0")
    a("--max-tokens", type=int, default=16, help="tokens to generate per prompt at most")
    a("--temperature", type=float, default=0.0, help="0: greedy")
    a("--top-p", type=float, default=1.0, help="nucleus sampling: 1.0 is off")
    a("--top-k", type=int, default=0, help="sample from the k likeliest tokens: 0 is off")
    a("--request-seed", type=int, default=None, help="the requests' sampling seed")
    a("--stop", action="append", help="a stop string (repeatable)")
    a("--ignore-eos", action="store_true", help="go on past the end-of-sequence token")
    a("--json", action="store_true", help="print one JSON object per prompt")
    gen.set_defaults(run=_generate)
    return gen


def _positive(parse):
    """An argparse type: parse(text), which must be a finite number above 0."""
    def value(text: str):
        try:
            number = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
        if not 0 < number < float("inf"):
            raise argparse.ArgumentTypeError(f"expected a number above 0, not {text!r}")
        return number
    return value


def _add_serve(sub) -> argparse.ArgumentParser:
    srv = sub.add_parser("serve", help="serve the OpenAI API over HTTP",
                         usage="python -m engine serve [MODEL] [options]")
    add_engine_args(srv, positional_model=True)
    a = srv.add_argument
    a("--host", default=None, help="the address to listen on (default: every interface, 0.0.0.0, "
                                  "as vLLM's; 127.0.0.1 for this machine only)")
    a("--port", type=int, default=8000, help="0: any free port (default: %(default)s)")
    a("--served-model-name", help="the model name clients ask for (default: MODEL)")
    a("--headless", action="store_true",
      help="run no API server on this node: a node other than the head (--node-rank 1 and up)")
    a("--disable-uvicorn-access-log", action=argparse.BooleanOptionalAction, default=False,
      help="no access log line per request (vLLM's name)")
    a("--max-prompt-chars", type=_positive(human_int), default=MAX_PROMPT_CHARS, metavar="N",
      help="refuse a prompt longer than N characters with a 400, before tokenizing it "
           "(default: %(default)s)")
    a("--idle-timeout", type=_positive(float), default=IDLE_TIMEOUT_S, metavar="SECONDS",
      help="close a connection that sends no whole request within SECONDS of connecting or "
           "of its last response, and refuse (408) a body slower than that (default: "
           "%(default)s)")
    srv.set_defaults(run=_serve)
    return srv


def _add_bench(sub) -> argparse.ArgumentParser:
    bench = sub.add_parser("bench", help="offline throughput, TTFT and ITL, optionally swept over a flag")
    add_engine_args(bench)
    add_bench_args(bench)
    bench.set_defaults(run=_bench)
    return bench


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser, and each command's own by name."""
    parser = _Parser(prog="python -m engine", description="the inference engine: vLLM's flags, "
                     "on CPU or GPU, tensor- and pipeline-parallel")
    parser.add_argument("--version", action="version", version=f"%(prog)s (hangscope) {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{generate,serve,bench}")
    return parser, {"generate": _add_generate(sub), "serve": _add_serve(sub), "bench": _add_bench(sub)}


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line, vLLM's spellings included; bad usage exits 2 with one line."""
    parser, commands = build_parser()
    known = {flag for command in commands.values() for action in command._actions
             for flag in action.option_strings}
    args, extras = parser.parse_known_args(dashed(argv, known))
    command = commands[args.command]
    vllm, unknown = leftover_flags(extras)
    if unknown or (extras and not vllm):
        command.error(f"unrecognized arguments: {' '.join(unknown or extras)}")
    if vllm:
        command.exit(2, f"{command.prog}: these vLLM flags are not supported here: {', '.join(vllm)}\n")
    if args.command == "serve":
        _check_serve(command, args)
    return args


def _check_serve(command: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.model_tag and args.model and args.model_tag != args.model:
        command.error(f"two models given, {args.model_tag} and --model {args.model}: give one")
    args.model = args.model_tag or args.model
    if not args.model:
        command.error(NO_MODEL)
    if args.headless and args.node_rank == 0:
        command.error("--headless is for the nodes that run no API server (--node-rank 1 and up); "
                      "node 0 is the head, which serves the API")


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        config_from_args(args).validate()
        if args.node_rank > 0:  # headless: this node's ranks only, until the head is done
            from engine.executor.node import run_node

            return run_node(config_from_args(args))
        return args.run(args)
    except (ValueError, ModelError, EngineError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
