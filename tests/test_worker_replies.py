"""The worker's replies leave in the order of the RPCs; on a GPU a step's reply is held
until the next RPC has been launched, or until its GPU is done while the busy loop waits.

The GPU's side is a test double here: `FakeEvent` stands for the CUDA event recorded
after a step's token copy, which a CPU cannot make. tests/test_gpu.py runs the real
path (the engine on a GPU, token for token against the CPU)."""
from multiprocessing import Pipe

import torch

from engine.scheduler_output import ModelRunnerOutput
from engine.worker.model_runner import SampledStep
from engine.worker.worker import Replies


class FakeEvent:
    def __init__(self):
        self.finished = False
        self.waited = False

    def query(self) -> bool:
        return self.finished

    def synchronize(self) -> None:
        self.waited = True


def on_gpu(step: int, tokens: list[int]) -> SampledStep:
    return SampledStep(step, torch.tensor(tokens), FakeEvent())


def received(conn) -> list:
    got = []
    while conn.poll(0.05):
        got.append(conn.recv())
    return got


def test_a_gpu_step_is_sent_after_the_next_one_was_launched():
    ours, theirs = Pipe()
    replies = Replies(ours, overlap=True)
    first, second = on_gpu(7, [3, 1]), on_gpu(8, [4, 2])
    replies.send(first)
    assert received(theirs) == [] and replies.poll_s() is not None
    replies.send(second)              # the next step is launched: the first one's reply goes
    assert first.done.waited and received(theirs) == [ModelRunnerOutput(7, [3, 1])]
    replies.send({"free": 10})        # any other reply waits for the step owed
    assert received(theirs) == [ModelRunnerOutput(8, [4, 2]), {"free": 10}]
    assert replies.poll_s() is None


def test_an_owed_step_goes_once_its_gpu_is_done_while_the_loop_waits():
    ours, theirs = Pipe()
    replies = Replies(ours, overlap=True)
    step = on_gpu(3, [5])
    replies.send(step)
    replies.send_owed_if_done()
    assert received(theirs) == []
    step.done.finished = True
    replies.send_owed_if_done()
    assert received(theirs) == [ModelRunnerOutput(3, [5])]


def test_without_overlap_and_on_the_cpu_every_reply_goes_at_once():
    ours, theirs = Pipe()
    Replies(ours, overlap=False).send(on_gpu(1, [9]))
    Replies(ours, overlap=True).send(SampledStep(2, torch.tensor([8])))   # CPU: no event
    assert received(theirs) == [ModelRunnerOutput(1, [9]), ModelRunnerOutput(2, [8])]
