"""The supervisor: `diag launch` runs the user's command, collects every rank's
state from the run dir, judges it, dumps stacks and reports; across nodes the
launchers talk to each other, authenticated. It owns the processes it starts
and their clean-up: nothing it started outlives it."""
