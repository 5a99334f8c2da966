"""Readers and writers of files, for a post-mortem and for people: Flight
Recorder dumps and logs in, reports, Perfetto traces and synthetic run dirs
out. Nothing here touches a live process; a bad file is an error with one line,
never a traceback."""
