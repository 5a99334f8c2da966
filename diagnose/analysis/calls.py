"""What one collective call is, for comparing the calls of a group's members:
its signature, its words, and whether its own sizes and dtypes fit together.

The members' calls at one seq must agree on the op, the sizes and the dtypes,
except where an op lets them differ by design (torch's Flight Recorder
analyzer draws the same lines): an all_to_all's sizes, a scatter's inputs and a
gather's outputs (only the root has them), a broadcast's or scatter's input
dtype. A dtype is compared only where its tensors are not empty. Output sizes
and dtypes come from Flight Recorder dumps only; the probe records inputs.
"""
from __future__ import annotations

from diagnose.core.snapshot import CollectiveRecord

ANY_INPUT_SIZES = frozenset({"all_to_all", "all_to_all_single", "all_to_all_v_single",
                             "scatter"})
ANY_OUTPUT_SIZES = frozenset({"all_to_all", "all_to_all_single", "all_to_all_v_single",
                              "gather"})
ANY_INPUT_DTYPE = frozenset({"scatter", "broadcast"})
ANY_OUTPUT_DTYPE = frozenset({"gather"})
IN_PLACE = frozenset({"all_reduce", "allreduce_coalesced"})
OWN_DTYPES = ANY_INPUT_DTYPE | ANY_OUTPUT_DTYPE   # ops whose input and output dtypes may differ


def signature(record: CollectiveRecord) -> tuple:
    """(op, input sizes, output sizes, input dtype, output dtype), with None
    where the op lets the members differ."""
    op, shapes, outputs = record.op, record.shapes, record.out_shapes
    in_dtype = record.dtype if _filled(shapes) else None
    if op in ANY_INPUT_DTYPE and outputs is not None:
        in_dtype = None
    out_dtype = record.out_dtype if op not in ANY_OUTPUT_DTYPE and _filled(outputs) else None
    return (op,
            None if op in ANY_INPUT_SIZES else _frozen(shapes),
            None if op in ANY_OUTPUT_SIZES or outputs is None else _frozen(outputs),
            in_dtype, out_dtype)


def describe_call(signature: tuple) -> str:
    op, shapes, outputs, dtype, out_dtype = signature
    text = op if shapes is None else f"{op} {_listed(shapes)}"
    if outputs is not None and outputs != shapes:
        text += f" -> {_listed(outputs)}"
    if dtype or out_dtype:
        text += f" {dtype or out_dtype}" if out_dtype in (None, dtype) else f" {dtype}->{out_dtype}"
    return text


def malformed(record: CollectiveRecord) -> str | None:
    """Why a call's own sizes or dtypes cannot be right, or None. Only where the
    source recorded its outputs (Flight Recorder). What an all_gather's output
    should be depends on the group's size, which a gloo dump does not give: it
    is not judged."""
    outputs = record.out_shapes
    if outputs is None:
        return None
    op = record.op
    if op in IN_PLACE and outputs != record.shapes:
        return f"{op}'s output must have its input's sizes"
    if (op not in OWN_DTYPES and _filled(record.shapes) and _filled(outputs)
            and record.out_dtype and record.dtype != record.out_dtype):
        return f"{op}'s output must have its input's dtype"
    return None


def _filled(shapes: list[list[int]] | None) -> bool:
    """Holds a tensor with a shape: not None, [] or [[]]."""
    return bool(shapes) and bool(shapes[0])


def _frozen(shapes: list[list[int]]) -> tuple:
    return tuple(tuple(shape) for shape in shapes)


def _listed(shapes: tuple) -> str:
    return str([list(shape) for shape in shapes])
