"""The tests' hand-built snapshots of a TP x PP job: diagnose/synth.py's Job,
which plays the probe into a Snapshot (one implementation for tests,
benchmarks and `diag synth`)."""
from diagnose.offline.synth import OP_S, Job

__all__ = ["OP_S", "Job"]
