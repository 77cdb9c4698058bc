"""A real Prometheus server on loopback for tests, plus `promtool`.

Debian's `prometheus` package provides both binaries (`.ci/run` installs it); tests skip with a clear
reason only when they are absent.
"""
from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml

from bench.local_stack import free_port

READY_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.2


def require_binary(name: str) -> str:
    """Path of a Prometheus binary (`prometheus`, `promtool`), or skip the test naming what is missing."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"`{name}` is not installed (apt-get install prometheus; .ci/run installs it)")
    return path


def promtool(*args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Runs `promtool ARGS`, capturing its output as text."""
    return subprocess.run([require_binary("promtool"), *args], input=stdin, capture_output=True,
                          text=True, cwd=cwd, timeout=120)


@dataclass
class PrometheusServer:
    """One Prometheus process scraping `targets` ({job: ["host:port", ...]}) every `scrape_interval`.

    `labels` are attached to every scraped series (e.g. a `namespace`, as Kubernetes discovery would).
    """

    targets: dict[str, list[str]]
    workdir: Path
    labels: dict[str, str] = field(default_factory=dict)
    scrape_interval: str = "1s"
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "PrometheusServer":
        """Starts the server and returns once it answers /-/ready."""
        binary = require_binary("prometheus")
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self._config()))
        log = (self.workdir / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--web.listen-address=127.0.0.1:{self.port}",
             f"--storage.tsdb.path={self.workdir / 'data'}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT)
        self._wait_ready()
        return self

    def _config(self) -> dict:
        jobs = [{"job_name": job, "scrape_interval": self.scrape_interval, "scrape_timeout": self.scrape_interval,
                 "static_configs": [{"targets": addrs, "labels": self.labels}]}
                for job, addrs in self.targets.items()]
        return {"global": {"scrape_interval": self.scrape_interval}, "scrape_configs": jobs}

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.process.returncode}: {self.log()}")
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(POLL_INTERVAL_S)  # prometheus offers no readiness event to await
        raise TimeoutError(f"prometheus not ready after {READY_TIMEOUT_S}s: {self.log()}")

    def log(self) -> str:
        return (self.workdir / "prometheus.log").read_text()[-4000:]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """Evaluates an instant query; returns the API's `result` list ({"metric", "value"} vectors)."""
        params = {"query": expr} if at is None else {"query": expr, "time": at}
        response = httpx.get(f"{self.url}/api/v1/query", params=params, timeout=10.0)
        body = response.json()
        if body.get("status") != "success":
            raise ValueError(f"query {expr!r} failed: {body.get('error', body)}")
        return body["data"]["result"]

    def wait_for(self, expr: str, condition, timeout: float = 30.0) -> list[dict]:
        """Polls `expr` until `condition(result)` holds (Prometheus scrapes on its own clock)."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if condition(result):
                return result
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expr!r} still {result} after {timeout}s")
            time.sleep(POLL_INTERVAL_S)

    def wait_for_scrapes_after(self, moment: float, timeout: float = 30.0) -> None:
        """Returns once every target has been scraped (successfully) after unix time `moment`.

        Counts the targets it was given: right after start-up Prometheus may not have scraped (or even
        created the `up` series of) every target yet, and `count(up)` alone would accept the early ones.
        """
        num_targets = sum(len(addresses) for addresses in self.targets.values())
        self.wait_for(f"min(timestamp(up == 1)) and on() count(up == 1) == {num_targets}",
                      lambda result: bool(result) and float(result[0]["value"][1]) > moment, timeout)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
