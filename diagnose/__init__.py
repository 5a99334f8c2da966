"""Hang diagnosis for TP x PP serving: probes, launcher, collector, analysis."""
