"""A real Prometheus server (Debian's `prometheus` package) for the tests and the
metrics plot: it scrapes one target every second, evaluates the shipped alert
rules every second, and is read through its HTTP API."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

from helpers.run import free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RULES = os.path.join(REPO, "deploy", "prometheus", "hangscope-alerts.yml")
READY_S = 60.0
CONFIG = """global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: ["{rules}"]
scrape_configs:
  - job_name: hangscope
    scrape_interval: 1s
    scrape_timeout: 1s
    static_configs:
      - targets: ["{target}"]
"""


def missing() -> str | None:
    """Why no Prometheus can run here, or None."""
    if shutil.which("prometheus") is None:
        return ("no prometheus binary on PATH: apt-get install prometheus (.ci/run installs "
                "it; setup.sh starts that install in the background)")
    return None


class Prometheus:
    """Started on a free port over `workdir`; stop() ends it."""

    def __init__(self, workdir: str, target: str):
        os.makedirs(workdir, exist_ok=True)
        config = os.path.join(workdir, "prometheus.yml")
        with open(config, "w") as f:
            f.write(CONFIG.format(rules=RULES, target=target))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = open(os.path.join(workdir, "prometheus.log"), "wb")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={config}",
             f"--storage.tsdb.path={os.path.join(workdir, 'data')}",
             f"--web.listen-address={self.url.removeprefix('http://')}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.proc.returncode}: see {self.log.name}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready within {READY_S:g} s")

    def api(self, path: str, **params) -> dict | list:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=5) as reply:
            body = json.load(reply)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        return self.api("query", query=expr, **({} if at is None else {"time": at}))["result"]

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict]:
        return self.api("query_range", query=expr, start=start, end=end, step=step)["result"]

    def firing(self) -> list[dict]:
        return [alert for alert in self.api("alerts")["alerts"] if alert["state"] == "firing"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
