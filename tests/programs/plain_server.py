"""A plain Python program (no process group): `diag launch --mark
plain_steps:Server.step -- python plain_server.py` watches it through its mark."""
import plain_steps

plain_steps.main()
