"""What every room shares: the snapshot's data, the names that cross rooms
(phases, verdict kinds), the rank layout, and the probe file's format. Standard
library only at import: the probe imports it into the user's ranks (progress.py
imports rich, a base dependency, only when it draws a bar: the engine's start-up
and diag's long reads, never the probe)."""
