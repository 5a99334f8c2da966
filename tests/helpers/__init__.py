"""What the tests share, one implementation of each: running diag and `diag launch`
(run.py), the synthetic job (synthetic.py), reading a run dir (collecting.py), real
vLLM (vllm_serving.py, vllm_faults.py), a terminal (terminal.py) and the rest.

The rules of this room: nothing here is a test; test files import from here and
never from one another; a helper that starts a process also ends it, or hands it
back to a caller who must."""
