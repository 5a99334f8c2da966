"""One rank's process: start-up phases, then the busy loop dequeue -> method -> reply.

worker.py is the process (torch.distributed init, model load, KV cache, then the
loop that reads the driver's ring); model_runner.py turns a SchedulerOutput into
input tensors, runs the model and samples (with the CUDA graphs of decode batches);
shm_ring.py is the shared-memory broadcast ring, one writer (the driver or a node's
relay) and one reader per worker.

Rules: a worker marks every phase it enters through the probe (diagnose.probe), so
diag sees where each rank is; every call to another rank goes through the top
level's communicator.py. worker imports model/ and the top level; never executor/
or above (the driver's state is what arrives in the ring).
"""
