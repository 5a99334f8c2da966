"""A live Textual view of a run: which rank is stuck where, and why."""
