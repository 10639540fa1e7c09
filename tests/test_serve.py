"""Serving a trained run with Ray Serve, over real HTTP on loopback: the tutorial's QCNN served by the
command (the user's model of a circuit and a classical input by `qml_ray.serve`: test_serve_api); answers equal to
infer's (its actors' Predictor, on the same rows), each bad request refused in one line while the
replica serves on, and a replica killed under load replaced with every request answered."""

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import cirq
import numpy as np
import pyarrow.parquet as pq
import pytest
import tensorflow_quantum as tfq

from qml_ray import features, infer

from conftest import ROOT, command_env, free_port, wait_for

ROWS = 6
MAX_BODY_MB = 0.05  # the QCNN's server refuses bodies of more
REPLICA = "ServeReplica:qml_ray:ModelReplica"


@dataclass
class Served:
    run: Path
    url: str
    rows: list[dict]  # ROWS rows as JSON gives them (circuits in base64)
    expected: np.ndarray  # infer's predictions for them


def post(url: str, body) -> tuple[int, dict]:
    """POST `body` (JSON, or bytes as they are) to `url`: the status and the JSON answer."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def rows_and_infers(run: Path, data: Path, columns: tuple[features.Column, ...]) -> tuple[list[dict], np.ndarray]:
    """The first ROWS rows of `data` as a request gives them, and the predictions infer's actors make of them."""
    table = pq.read_table(data).slice(0, ROWS)
    names = [column.name for column in columns]
    batch = {name: table.column(name).to_numpy(zero_copy_only=False) for name in names}
    expected = np.stack(infer.Predictor(str(run), columns)(dict(batch))["prediction"]).reshape(ROWS, -1)
    rows = [
        {name: base64.b64encode(value).decode() if isinstance(value, bytes) else value for name, value in row.items()}
        for row in table.select(names).to_pylist()
    ]
    return rows, expected


@pytest.fixture(scope="module")
def qcnn(trained_run, shared_cluster, tmp_path_factory):
    """The tutorial's trained QCNN served by the command on the shared Ray, stopped by Ctrl-C (SIGINT)."""
    run = trained_run.path
    rows, expected = rows_and_infers(run, run / "data" / "test.parquet", (features.Column("circuit", "circuits"),))
    port, out = free_port(), tmp_path_factory.mktemp("serve") / "out.txt"
    command = [sys.executable, "-m", "qml_ray.serve", "--run", str(run), "--port", str(port)]
    command += ["--address", shared_cluster.address, "--serve-max-body-mb", str(MAX_BODY_MB)]
    with open(out, "w") as output:
        process = subprocess.Popen(command, cwd=ROOT, env=command_env(), stdout=output, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "serving" in out.read_text() or process.poll() is not None, "the serving line", 180)
        assert process.poll() is None, out.read_text()
        yield Served(run, f"http://127.0.0.1:{port}", rows, expected)
    finally:
        process.send_signal(signal.SIGINT)
        status = process.wait(timeout=60)
    lines = out.read_text().splitlines()
    assert lines == [
        f"serving {run} at http://127.0.0.1:{port} (POST /predict); Ctrl-C stops",
        f"interrupted: stopped serving {run}",
    ]
    assert status == 130
    wait_for(lambda: not shared_cluster.idle(), "the served application gone from the shared Ray", 30)


def test_the_served_qcnn_answers_as_infer_does(qcnn):
    status, answer = post(f"{qcnn.url}/predict", {"rows": qcnn.rows})
    assert status == 200
    np.testing.assert_allclose(answer["predictions"], qcnn.expected, rtol=1e-5, atol=1e-6)
    assert get(f"{qcnn.url}/healthz") == (200, {"status": "ok"})
    status, described = get(f"{qcnn.url}/")
    assert status == 200 and described["request"].startswith("POST /predict")
    assert list(described["inputs"]) == ["circuit"] and "8 qubits" in described["inputs"]["circuit"]


def other_qubits_circuit() -> str:
    return base64.b64encode(tfq.convert_to_tensor([cirq.Circuit(cirq.X(cirq.GridQubit(5, 5)))]).numpy()[0]).decode()


def refused(served: Served, bad: list) -> None:
    """Each bad request answered with its status and one line, then a good one answered as before."""
    for body, status, message in bad:
        answered, answer = post(f"{served.url}/predict", body)
        assert (answered, list(answer)) == (status, ["error"]) and message in answer["error"], (message, answer)
        assert "\n" not in answer["error"]
    status, answer = post(f"{served.url}/predict", {"rows": served.rows})
    assert status == 200
    np.testing.assert_allclose(answer["predictions"], served.expected, rtol=1e-5, atol=1e-6)


def test_each_bad_request_is_refused_in_one_line_and_the_replica_serves_on(qcnn):
    bad = [
        ({"rows": [{"circuit": "not base64!"}]}, 400, "rows[0].circuit is not base64"),
        ({"rows": [{"circuit": base64.b64encode(b"\x01\x02").decode()}]}, 400, "not a serialized TFQ circuit"),
        ({"rows": [{"circuit": other_qubits_circuit()}]}, 400, "rows[0].circuit is on q(5, 5), not among"),
        ({"rows": []}, 400, 'the body must be {"rows": [{INPUT: VALUE, ...}, ...]}'),
        (b"{rows", 400, "the body is not JSON"),
        ({"rows": qcnn.rows * 50}, 413, "the body is larger than the 0.05 MB a request may have"),
    ]
    refused(qcnn, bad)
    assert get(f"{qcnn.url}/nowhere")[0] == 404


def test_a_replica_killed_under_load_is_replaced_and_every_request_is_answered(qcnn, shared_cluster):
    from ray.util.state import list_actors

    def replicas() -> list:
        alive = [("class_name", "=", REPLICA), ("state", "=", "ALIVE")]
        return list_actors(address=shared_cluster.dashboard, filters=alive, raise_on_missing_output=False)

    (first,) = replicas()
    answers, stop = [], threading.Event()

    def client():
        while not stop.is_set():
            answers.append(post(f"{qcnn.url}/predict", {"rows": qcnn.rows}))

    clients = [threading.Thread(target=client) for _ in range(8)]
    for thread in clients:
        thread.start()
    try:
        wait_for(lambda: len(answers) >= 16, "answers before the kill", 120)
        os.kill(first.pid, signal.SIGKILL)
        killed_at = len(answers)
        wait_for(lambda: [r.pid for r in replicas()] not in ([], [first.pid]), "a replacement replica", 120)
        wait_for(lambda: len(answers) >= killed_at + 16, "answers from the replacement", 120)
    finally:
        stop.set()
        for thread in clients:
            thread.join(timeout=150)
    assert {status for status, _ in answers} == {200}
    for _, answer in answers:
        np.testing.assert_allclose(answer["predictions"], qcnn.expected, rtol=1e-5, atol=1e-6)
