"""The driver's side of the ranks: start them, send every rank each call, collect replies.

local_workers.py spawns one node's worker processes and owns their shared-memory
ring, reply pipes and death checks; node.py is the multi-node link (the head's
side, and the relay process of a headless node); executor.py is collective_rpc
over both.

Rules: waiting is never blind. Every wait here watches each worker's process
sentinel and each node link, so a dead rank is an error (WorkerDiedError, naming
the rank) within a poll interval, never a hang. Nothing is read from a node link
before the node is authenticated (diagnose.core.link). executor imports worker/
(the process entry point and the ring) and the top level; never core/ or above.
"""
