"""Started in every Python process of a `diag launch` run: `diag launch` puts
this directory first on PYTHONPATH. Without DIAG_RUN_DIR it only runs the
sitecustomize it hides, if there is one; with it, it arms the probe's
torch.distributed tracing, the --mark functions and the vLLM plugin (all wait
for their module's import, so a process that never imports them pays a dict
lookup per import). DIAG_PROBE_PATH names where the launcher's own psutil is,
appended last too: the job's Python may be another environment's."""
import importlib.machinery
import importlib.util
import os
import sys


def _run_hidden_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    others = [entry for entry in sys.path if os.path.abspath(entry or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def _arm_probe():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    for entry in [repo] + os.environ.get("DIAG_PROBE_PATH", "").split(os.pathsep):
        if entry and entry not in sys.path:
            sys.path.append(entry)  # last: the program's own modules win over ours
    from diagnose.probe import marks, torch_dist, vllm
    torch_dist.install()
    marks.install()
    vllm.install()


_run_hidden_sitecustomize()
if os.environ.get("DIAG_RUN_DIR"):
    _arm_probe()
