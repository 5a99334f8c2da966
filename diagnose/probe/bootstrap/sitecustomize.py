"""Started in every Python process of a `diag launch` run: `diag launch` puts
this directory first on PYTHONPATH. Without DIAG_RUN_DIR it only runs the
sitecustomize it hides, if there is one; with it, it arms the probe's
torch.distributed tracing, the --mark functions and the vLLM plugin (all wait
for their module's import, so a process that never imports them pays a dict
lookup per import).

The job's Python may be another environment's: the probe's own packages
(hangscope's diagnose, and kernels for the GPU faults, from this checkout; psutil
from DIAG_PROBE_PATH, the launcher's environment) are found by a finder last on
sys.meta_path, which finds those names and nothing else. The job's own modules
win, and it never sees the rest of the debugger's environment (its triton, its
torch)."""
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys


class _ProbePackages(importlib.abc.MetaPathFinder):
    def __init__(self, places: dict[str, list[str]]):
        self.places = places   # top-level package -> the directories it is looked for in

    def find_spec(self, name, path=None, target=None):
        where = self.places.get(name)
        return None if where is None else importlib.machinery.PathFinder.find_spec(name, where)


def _run_hidden_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    others = [entry for entry in sys.path if os.path.abspath(entry or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def _arm_probe():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    probe_path = [entry for entry in os.environ.get("DIAG_PROBE_PATH", "").split(os.pathsep) if entry]
    sys.meta_path.append(_ProbePackages({"diagnose": [repo], "kernels": [repo], "psutil": probe_path}))
    from diagnose.probe import marks, torch_dist, vllm
    torch_dist.install()
    marks.install()
    vllm.install()


_run_hidden_sitecustomize()
if os.environ.get("DIAG_RUN_DIR"):
    _arm_probe()
