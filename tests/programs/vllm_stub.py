"""A STUB of vLLM for tests/test_vllm_stub.py: vLLM's module layout and process
names (an engine core, workers named VllmWorker-R that set up their process
groups through gpu_worker.init_worker_distributed_environment), but not the
names listed in LEFT_OUT, so that the plugin meets a release that lacks them.

    vllm_stub.py --write DIR VERSION   writes the package `vllm` into DIR
    vllm_stub.py --serve DIR [DP_RANK DP_SIZE]
                                       runs an engine core (this process) and two
                                       workers for three steps, then shuts down;
                                       with DP_RANK and DP_SIZE, as the engine core
                                       EngineCore_DP<DP_RANK> of a DP job whose
                                       config keeps its DP size (0.11, or a MoE model)
"""
import multiprocessing
import os
import sys

LEFT_OUT = ("FutureWrapper", "MultiprocExecutor.start_worker_monitor",
            "WorkerProc.worker_busy_loop", "GroupCoordinator.all_gather",
            "CPUWorker.determine_available_memory", "CPUWorker.compile_or_warm_up_model")
WORLD_SIZE = 2
STEPS = 3

MODULES = {
    "vllm/__init__.py": '__version__ = "{version}"\n',
    "vllm/plugins/__init__.py": "def load_general_plugins():\n    pass\n",
    "vllm/v1/__init__.py": "",
    "vllm/v1/executor/__init__.py": "",
    "vllm/v1/worker/__init__.py": "",
    "vllm/distributed/__init__.py": "",
    "vllm/config.py": '''from dataclasses import dataclass, field


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 2
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    data_parallel_rank: int = 0
    worker_cls: str = "vllm.v1.worker.cpu_worker.CPUWorker"


@dataclass
class DeviceConfig:
    device: str = "cpu"


@dataclass
class VllmConfig:
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    device_config: DeviceConfig = field(default_factory=DeviceConfig)
''',
    "vllm/distributed/parallel_state.py": '''class GroupCoordinator:
    def __init__(self, unique_name, ranks, rank):
        self.unique_name, self.ranks = unique_name, ranks
        self.world_size, self.rank_in_group = len(ranks), ranks.index(rank)

    def all_reduce(self, value):
        return value        # the stub computes nothing: each rank holds the sum already


_TP = _PP = None


def init(vllm_config, rank):
    global _TP, _PP
    size = vllm_config.parallel_config.tensor_parallel_size
    _TP = GroupCoordinator("tp:0", list(range(size)), rank)
    _PP = GroupCoordinator("pp:0", [rank], rank)


def get_tp_group():
    return _TP


def get_pp_group():
    return _PP
''',
    "vllm/v1/worker/gpu_worker.py": '''from vllm.distributed import parallel_state


def init_worker_distributed_environment(vllm_config, rank, distributed_init_method=None,
                                        local_rank=-1, backend="nccl"):
    parallel_state.init(vllm_config, rank)
''',
    "vllm/v1/worker/cpu_worker.py": '''from vllm.distributed.parallel_state import get_tp_group
from vllm.v1.worker.gpu_worker import init_worker_distributed_environment


class CPUWorker:
    def __init__(self, vllm_config, rank):
        self.vllm_config, self.rank = vllm_config, rank

    def init_device(self):
        init_worker_distributed_environment(self.vllm_config, self.rank, "env://", self.rank)

    def load_model(self):
        pass

    def initialize_from_config(self, kv_cache_config):
        pass

    def execute_model(self, step):
        return get_tp_group().all_reduce(step)
''',
    "vllm/v1/executor/multiproc_executor.py": '''import multiprocessing
from dataclasses import dataclass


@dataclass
class WorkerProcHandle:
    proc: multiprocessing.Process
    rank: int


class WorkerProc:
    def __init__(self, vllm_config, rank, conn):
        from vllm.v1.worker.cpu_worker import CPUWorker
        self.conn, self.worker = conn, CPUWorker(vllm_config, rank)
        self.worker.init_device()
        self.worker.load_model()
        self.worker.initialize_from_config(None)

    def serve(self):
        while True:
            method, args = self.conn.recv()
            if method == "stop":
                return
            self.conn.send(getattr(self.worker, method)(*args))


def worker_main(vllm_config, rank, conn):
    import vllm.plugins
    vllm.plugins.load_general_plugins()
    WorkerProc(vllm_config, rank, conn).serve()


class MultiprocExecutor:
    def __init__(self, vllm_config):
        self.parallel_config = vllm_config.parallel_config
        context = multiprocessing.get_context("spawn")
        self.conns, self.workers = [], []
        for rank in range(self.parallel_config.tensor_parallel_size):
            ours, theirs = context.Pipe()
            proc = context.Process(target=worker_main, args=(vllm_config, rank, theirs),
                                   name=f"VllmWorker-{rank}")
            proc.start()
            self.conns.append(ours)
            self.workers.append(WorkerProcHandle(proc, rank))

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, non_block=False):
        for conn in self.conns:
            conn.send((method, args))
        return [conn.recv() for conn in self.conns]

    def shutdown(self):
        for conn in self.conns:
            conn.send(("stop", ()))
        for handle in self.workers:
            handle.proc.join(timeout=30)
''',
}


def write(directory: str, version: str) -> None:
    for path, text in MODULES.items():
        target = os.path.join(directory, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w") as sink:
            sink.write(text.replace("{version}", version))


def serve(directory: str, dp_rank: int = 0, dp_size: int = 1) -> None:
    sys.path.insert(0, directory)      # the children inherit it: spawn passes sys.path on
    multiprocessing.current_process().name = f"EngineCore_DP{dp_rank}"
    import vllm.plugins
    vllm.plugins.load_general_plugins()
    from vllm.config import ParallelConfig, VllmConfig
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor
    parallel = ParallelConfig(data_parallel_size=dp_size, data_parallel_rank=dp_rank)
    executor = MultiprocExecutor(VllmConfig(parallel_config=parallel))
    for step in range(STEPS):
        assert executor.collective_rpc("execute_model", args=(step,)) == [step] * WORLD_SIZE
    executor.shutdown()
    print(f"stub served {STEPS} steps", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--write":
        write(sys.argv[2], sys.argv[3])
    else:
        serve(sys.argv[2], *map(int, sys.argv[3:5]))
