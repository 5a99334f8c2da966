"""diag attach: a job that someone else started, hung now, seen from outside.

It finds the job's processes under one pid (discover.py), checks that their
stacks may be read (ptrace.py), samples them with py-spy (sample.py), turns
what it saw into the Snapshot the one analysis judges (states.py), and writes
a run dir that diag analyze and diag tui open (run.py). It owns none of the
job's processes and never signals them, unless --kill asks, after the report.
"""
