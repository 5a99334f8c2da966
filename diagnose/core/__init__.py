"""What every room shares: the snapshot's data, the names that cross rooms
(phases, verdict kinds), the rank layout, and the probe file's format. Pure and
standard library only: the probe imports it into the user's ranks."""
