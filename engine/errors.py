"""The engine's failures that its command line reports in one line (`error: ...`,
exit 1) instead of a traceback. The modules that raise them import torch; the
command line names them before it does, so that a bad flag is answered at once."""


class EngineError(RuntimeError):
    """The engine cannot go on: a worker or a node is gone, or a node cannot join."""
