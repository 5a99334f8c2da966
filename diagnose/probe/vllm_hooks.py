"""How the vLLM plugin hooks vLLM: every hook is a row of one table (HOOKS in
vllm.py), applied here by name and with a check. A name the running release
lacks, or a hook that fails, becomes a note in the run's report, and every
other hook still works; a release outside the tested range is said once and
hooked all the same. No code outside the table asks which release it is in.

`python -m diagnose.probe.vllm_listing` (in a venv with vLLM, the repo on
PYTHONPATH) prints which rows that release has, without starting vLLM.
"""
from __future__ import annotations

import functools
import importlib
import re
import sys
from dataclasses import dataclass
from typing import Callable

from diagnose.core.vocab import Role
from diagnose.probe import notes, torch_dist

TESTED = ((0, 11), (0, 32))    # the oldest and newest releases of docs/vllm-matrix.md
WORKER_CLASS = "parallel_config.worker_cls"   # the module of the rows on vLLM's worker class
CHECKED_WORKER = "vllm.v1.worker.cpu_worker.CPUWorker"   # that class, for the listing here


@dataclass(frozen=True)
class Hook:
    module: str           # vLLM's module, or WORKER_CLASS
    name: str             # the qualified name in it: "FutureWrapper._wait_for_response"
    records: str          # what the hook records, said in the note when it is missing
    releases: str         # the releases that have the name, as the matrix found them
    role: Role            # where it is applied: the workers, the engine core (driver) or
                          # the API server (frontend)
    wrap: Callable        # wrap(original, owner) -> what replaces the original in owner
    group: str = ""       # rows of one group are alternatives: the first found is applied
    optional: str = ""    # why a release without the name loses nothing: no note then


def install(hooks: list[Hook], role: Role) -> None:
    """Apply the rows of `role` as each of their modules is imported."""
    say_release()
    rows = [hook for hook in hooks if hook.role == role and hook.module != WORKER_CLASS]
    for module in dict.fromkeys(hook.module for hook in rows):
        torch_dist.on_import(module, functools.partial(
            apply, hooks=[hook for hook in rows if hook.module == module]))


def apply(target, hooks: list[Hook]) -> list[Hook]:
    """Apply the hooks to `target` (their module, or the worker class); the
    hooks applied. The rest are notes, unless optional or a later alternative
    of their group is there."""
    applied: list[Hook] = []
    done: set[str] = set()
    for index, hook in enumerate(hooks):
        if hook.group and hook.group in done:
            continue
        owner, attribute, original = resolve(target, hook.name)
        if original is None:
            later = any(other.group == hook.group for other in hooks[index + 1:])
            if not hook.optional and not (hook.group and later):
                notes.note(f"vLLM {release()}: no {hook.name}; not recorded: {hook.records}")
            continue
        try:
            setattr(owner, attribute, hook.wrap(original, owner))
        except Exception as error:
            notes.note(f"vLLM {release()}: hooking {hook.name} failed "
                       f"({type(error).__name__}: {error}); not recorded: {hook.records}")
            continue
        applied.append(hook)
        done.add(hook.group)
    return applied


def resolve(target, name: str):
    """(owner, attribute, the original) for a dotted name in target; original None if absent."""
    *path, attribute = name.split(".")
    owner = target
    for part in path:
        owner = getattr(owner, part, None)
        if owner is None:
            return None, attribute, None
    return owner, attribute, getattr(owner, attribute, None)


def release() -> str:
    """The running vLLM's version, as vLLM gives it."""
    return str(getattr(sys.modules.get("vllm"), "__version__", None) or _dist_version())


def _dist_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("vllm")
    except PackageNotFoundError:
        return "(unknown version)"


def release_tuple(text: str) -> tuple[int, int] | None:
    found = re.match(r"(\d+)\.(\d+)", text)
    return None if found is None else (int(found[1]), int(found[2]))


def say_release() -> None:
    """One note (the report says each text once) for a release outside the tested range."""
    text = release()
    found = release_tuple(text)
    if found is None or not TESTED[0] <= found <= TESTED[1]:
        low, high = (".".join(map(str, end)) for end in TESTED)
        notes.note(f"vLLM {text} is outside the releases hangscope was tested with "
                   f"({low} to {high}); hooked all the same, and what it lacks is noted")


def listing(hooks: list[Hook], has: Callable[[Hook], bool] | None = None) -> list[tuple[Hook, str]]:
    """Each row and what this release makes of it: "applied", "missing" (a note
    in a run), "absent" (optional or an alternative applies) or "unused" (an
    earlier alternative of its group applies). has(hook) says whether the
    release has the name; by default vLLM's modules are imported (nothing starts)."""
    found, done = [], set()
    for index, hook in enumerate(hooks):
        if hook.group and hook.group in done:
            found.append((hook, "unused"))
        elif (has or _has)(hook):
            found.append((hook, "applied"))
            done.add(hook.group)
        else:
            later = any(other.group == hook.group for other in hooks[index + 1:])
            noted = not hook.optional and not (hook.group and later)
            found.append((hook, "missing" if noted else "absent"))
    return found


def _has(hook: Hook) -> bool:
    module = CHECKED_WORKER.rpartition(".")[0] if hook.module == WORKER_CLASS else hook.module
    try:
        target = importlib.import_module(module)
    except Exception:
        return False
    if hook.module == WORKER_CLASS:
        target = getattr(target, CHECKED_WORKER.rpartition(".")[2], None)
    return resolve(target, hook.name)[2] is not None
