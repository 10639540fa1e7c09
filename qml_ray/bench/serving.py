"""`bench serving`: requests/s and latency of `python -m qml_ray.serve` on loopback, against one plain Keras
process answering one request at a time.

Each server answers POST /predict of one row (a circuit of the run's validation data): qml_ray's Ray Serve
application with its local Ray, and the baseline, this module run as a script: an HTTP server of one
thread holding the same model, reading the same JSON the same way (serving.model_inputs_of) and calling
the model once a request. For each count of concurrent clients, at most `requests` requests are sent, for
at most `seconds`; every request must be answered 200.
"""

import base64
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

SERVERS = ("qml_ray", "keras")
START_SECONDS = 300


def one_row(run: str) -> dict:
    """A request of one row: the first circuit of the run's validation data."""
    circuit = pq.read_table(Path(run, "data", "test.parquet"), columns=["circuit"]).column("circuit")[0].as_py()
    return {"rows": [{"circuit": base64.b64encode(circuit).decode()}]}


def start(server: str, run: str, port: int, log: Path) -> subprocess.Popen:
    """The server, answering on `port` once this returns."""
    module = ["qml_ray.serve", "--run", run] if server == "qml_ray" else ["qml_ray.bench.serving", run]
    with open(log, "w") as output:
        process = subprocess.Popen([sys.executable, "-m", *module, "--port", str(port)], stdout=output, stderr=output)
    deadline = time.monotonic() + START_SECONDS
    while "serving" not in log.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"the {server} server did not start: {log.read_text()[-2000:]}")
        time.sleep(0.5)
    return process


def load(url: str, body: bytes, clients: int, requests: int, seconds: float) -> dict:
    """`clients` threads sending requests (at most `requests` in all, for at most `seconds`): the count
    sent, answered 200, and the latencies."""
    sent, latencies, failures, lock = [0], [], [], threading.Lock()
    deadline = time.monotonic() + seconds

    def client():
        while time.monotonic() < deadline:
            with lock:
                if sent[0] >= requests:
                    return
                sent[0] += 1
            began = time.perf_counter()
            try:
                request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=seconds) as response:
                    response.read()
                latencies.append(time.perf_counter() - began)
            except OSError as err:
                failures.append(str(err))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    return {
        "clients": clients,
        "sent": sent[0],
        "answered": len(latencies),
        "failed": len(failures),
        "seconds": elapsed,
        "requests_per_second": len(latencies) / elapsed,
        "p50_ms": 1000 * float(np.percentile(latencies, 50)) if latencies else None,
        "p99_ms": 1000 * float(np.percentile(latencies, 99)) if latencies else None,
    }


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure(run: str, clients: list[int], requests: int, seconds: float, out: Path) -> list[dict]:
    """Every server under every count of clients (a warm-up request first); the servers stopped after."""
    body = json.dumps(one_row(run)).encode()
    records = []
    for server in SERVERS:
        port = free_port()
        process = start(server, run, port, out / f"{server}.log")
        try:
            url = f"http://127.0.0.1:{port}/predict"
            load(url, body, 1, 1, seconds)
            records += [{"server": server, **load(url, body, count, requests, seconds)} for count in clients]
        finally:
            process.send_signal(signal.SIGINT)
            process.wait(timeout=60)
    return records


def unanswered(records: list[dict]) -> dict[str, int]:
    """The requests each server left unanswered, of those it lost any."""
    lost = {server: sum(r["sent"] - r["answered"] for r in records if r["server"] == server) for server in SERVERS}
    return {server: count for server, count in lost.items() if count}


def markdown(doc: dict) -> str:
    lines = [
        f"Run {doc['run']}, one row a request, at most {doc['requests']} requests or {doc['seconds']:g} s per step; "
        f"{doc['cpu']}, {doc['machine_cpus']} CPUs (clients and servers share them).",
        "",
        "| server | clients | sent | answered | requests/s | p50 ms | p99 ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in doc["records"]:
        lines.append(
            f"| {r['server']} | {r['clients']} | {r['sent']} | {r['answered']} | {r['requests_per_second']:.1f} "
            f"| {r['p50_ms']:.1f} | {r['p99_ms']:.1f} |"
        )
    return "\n".join(lines) + "\n"


class _Baseline(BaseHTTPRequestHandler):
    """One request at a time: the JSON read as the endpoint reads it, one call of the model."""

    model = inputs = None

    def do_POST(self):
        from qml_ray import features, serving

        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        by_input = serving.model_inputs_of(body, self.inputs)
        rows = len(body["rows"])
        predictions = self.model(features.as_keras_takes(by_input), training=False).numpy().reshape(rows, -1)
        answer = json.dumps({"predictions": predictions.tolist()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


def baseline(run: str, port: int) -> None:
    """The plain Keras server: the run's model in this process, one thread, until SIGINT."""
    from qml_ray import features, infer

    _Baseline.model = infer.load_trained_model(run)
    _Baseline.inputs = features.model_inputs(_Baseline.model)
    server = HTTPServer(("127.0.0.1", port), _Baseline)
    signal.signal(signal.SIGINT, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"serving {run} at http://127.0.0.1:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":  # the baseline server: RUN --port PORT
    baseline(sys.argv[1], int(sys.argv[3]))
