"""vLLM's signs of a hang: the broadcast warning and the execute_model timeout.

"No available shared memory broadcast block found in 60 seconds" means the
engine core could not write the next step into the ring its workers read: a
worker stopped coming back from execute_model. The same warning appears when
the workers are busy compiling or loading, so it is a hang only if no request
finished after it (or if the RPC then timed out). vLLM's log never says which
worker: the engine core only sees that the step did not come back.
"""
from __future__ import annotations

import json
import shlex

from diagnose.offline.logs.model import Finding, Kind, Severity
from diagnose.offline.logs.words import finding

TIMEOUT_NOTE = ("The messages name no setting; in vLLM 0.32 the execute_model timeout is "
                "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (300 s by default) and the warning repeats "
                "every VLLM_RINGBUFFER_WARNING_INTERVAL seconds (60).")


def hang(entries: dict[Kind, list], ctx) -> tuple[Finding, tuple] | None:
    """The hang finding (or the note that the warning was slow work), and its order."""
    waits, rpcs = entries.get(Kind.BROADCAST_WAIT, []), entries.get(Kind.RPC_TIMEOUT, [])
    if not waits and not rpcs:
        return None
    start = min(waits or rpcs, key=lambda entry: entry.first.order)
    began = start.first
    progress = [entry for entry in entries.get(Kind.PROGRESS, [])
                if entry.latest.order > began.order]
    ready = entries.get(Kind.READY, [])
    if waits:
        count = sum(entry.count for entry in waits)
        last = max((entry.latest for entry in waits), key=lambda event: event.order)
        seconds = began.info["seconds"]
        who, _ = ctx.describe(began.proc)
        when = (f"once, at {began.stamp or 'line ' + str(began.line)}" if count == 1 else
                f"{count} times, first {began.stamp or '?'}, last {last.stamp or '?'}")
        seen = f"{who} found no free shared-memory broadcast block for {seconds} s ({when})"
    else:
        count, last, seen = 0, began, ""
    if progress and not rpcs:
        during = (" during start-up" if ready and ready[0].first.order > began.order else "")
        after = max((entry.latest for entry in progress), key=lambda event: event.order)
        note = finding(start, ctx, Severity.NOTE, kind=Kind.SLOW_BROADCAST,
                       summary=f"{seen}{during}, and requests finished after it (the last: "
                               f"{after.info.get('what', 'a request')} at "
                               f"{after.stamp or 'line ' + str(after.line)})",
                       advice="slow work such as compilation or weight loading, not a hang")
        note.count, note.last = count, last.stamp
        return note, began.order
    rpc = rpcs[0].first if rpcs else None
    timed_out = (f"; then the RPC call to {rpc.info.get('method', 'execute_model')} timed out"
                 f"{' at ' + rpc.stamp if rpc.stamp else ''}" if rpc else "")
    summary = (f"a worker stopped returning from execute_model: {seen}{timed_out}" if seen
               else f"a worker stopped returning from execute_model{timed_out}")
    since = f"after {began.stamp}" if began.stamp else "after it"
    variables = {entry.first.info.get("variable") for entry in waits + rpcs} - {None}
    advice = " ".join([
        "vLLM's log does not say which worker: the engine core only sees that the step never "
        "came back, and every worker reads the same broadcast.",
        "The broadcast warning also appears during long compilation or weight loading; tell "
        "them apart by whether any request finished after it: here none did "
        f"({since}).",
        (f"The messages name {', '.join(sorted(variables))}." if variables else TIMEOUT_NOTE),
        f"To name the rank next time: diag launch --on-hang kill -- {serve_command(ctx.job)}",
    ])
    found = finding(start, ctx, Severity.HANG, kind=Kind.EXECUTE_MODEL_HANG, summary=summary,
                    advice=advice)
    found.count, found.last = max(count, 1), last.stamp
    return found, began.order


def serve_command(job) -> str:
    """`vllm serve ...` rebuilt from the server's non-default args, when the log has them."""
    args = dict(job.serve_args or {})
    if not args:
        return "vllm serve <your arguments>"
    model = args.pop("model_tag", None) or args.get("model")
    if args.get("model") == model:
        args.pop("model")
    words = ["vllm", "serve"] + ([str(model)] if model else [])
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is None:
            continue
        if value is True:
            words.append(flag)
        elif value is False:
            words.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, (list, tuple)):
            words += [flag] + [str(item) for item in value]
        elif isinstance(value, dict):
            words += [flag, _json(value)]
        else:
            words += [flag, str(value)]
    return " ".join(shlex.quote(word) for word in words)


def _json(value: dict) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


