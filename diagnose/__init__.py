"""Hang diagnosis for TP x PP serving, in rooms named for where their code runs:

  core/      the data and names every room shares (snapshot, vocabulary, rank
             layout, the probe file's format); pure, standard library only
  probe/     inside the user's ranks: cheap, never raises into the host program
  launch/    the supervisor (`diag launch` and its live view, the collector,
             dumps, other nodes): owns processes and their clean-up
  analysis/  snapshot -> verdicts: pure, no I/O, no clock
  offline/   readers and writers of files (Flight Recorder dumps, logs,
             reports, Perfetto traces, synthetic run dirs): no live process

Arrows go one way: probe, analysis and offline import core only; launch may
import all of them and the TUI; cli/ wires the commands together.
"""
