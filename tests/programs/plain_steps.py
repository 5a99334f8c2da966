"""A plain Python program's step, for `--mark plain_steps:Server.step`: no
torch.distributed, no probe call of its own. PLAIN_STALL_AT=N makes step N
block; PLAIN_STEPS is how many steps main runs (default 1000)."""
import os
import time

STALL_S = 60.0   # long past every detection limit; diag launch ends the run first


class Server:
    def step(self, number: int) -> None:
        if str(number) == os.environ.get("PLAIN_STALL_AT"):
            time.sleep(STALL_S)
        time.sleep(0.05)


def main() -> None:
    server = Server()
    for number in range(int(os.environ.get("PLAIN_STEPS", "1000"))):
        server.step(number)
