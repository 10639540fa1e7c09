"""The user's model of a circuit and a classical input (conftest's mymodel), served by `qml_ray.serve` in
this process: answered as infer answers, over HTTP and from Python; its bad requests refused in one line."""

import sys

import numpy as np
import pytest

from qml_ray import features

from conftest import free_port, run_command, wait_for
from test_serve import Served, get, post, refused, rows_and_infers


@pytest.fixture(scope="module")
def users(user_project, shared_cluster, tmp_path_factory):
    """The user's model (a circuit and a command, a number) trained for an epoch, served by `qml_ray.serve`
    in this process on the shared Ray."""
    import ray

    import qml_ray

    storage = tmp_path_factory.mktemp("runs")
    options = (
        "--epochs",
        1,
        "--workers",
        1,
        "--storage",
        storage,
        "--name",
        "mine",
        "--address",
        shared_cluster.address,
    )
    trained = run_command("train", "--model", "mymodel:build", "--data", "data", *options, cwd=user_project)
    assert trained.returncode == 0, trained.stderr[-3000:]
    run = storage / "mine"
    columns = (features.Column("circuit", "circuits"), features.Column("command", "number"))
    sys.path.insert(0, str(user_project))  # as the command's working folder: the model's module
    try:
        rows, expected = rows_and_infers(run, user_project / "data" / "part-000.parquet", columns)
        port = free_port()
        served = qml_ray.serve(str(run), port=port, address=shared_cluster.address)
        try:
            yield served, Served(run, served.url, rows, expected)
        finally:
            served.stop()
            ray.shutdown()
    finally:
        sys.path.remove(str(user_project))
    wait_for(lambda: not shared_cluster.idle(), "the served application gone from the shared Ray", 30)


@pytest.mark.slow  # a training (its fixture)
def test_a_users_model_of_a_circuit_and_a_number_answers_as_infer_does_over_http_and_from_python(users):
    served, expected = users
    status, answer = post(f"{served.url}/predict", {"rows": expected.rows})
    assert status == 200
    np.testing.assert_allclose(answer["predictions"], expected.expected, rtol=1e-5, atol=1e-6)
    from_python = served.predict(expected.rows)
    np.testing.assert_allclose(from_python, expected.expected, rtol=1e-5, atol=1e-6)
    assert list(get(f"{served.url}/")[1]["inputs"]) == ["circuit", "command"]
    row = expected.rows[0]
    refused(
        expected,
        [
            ({"rows": [{"circuit": row["circuit"]}]}, 400, "model input 'command' has no column of its name"),
            ({"rows": [row, {"circuit": row["circuit"]}]}, 400, "rows[1] has no value for 'command'"),
            ({"rows": [{**row, "command": [0.5, 0.5]}]}, 400, "column command (numbers of 2) does not fit model input"),
            (
                {"rows": [{**row, "command": "high"}]},
                400,
                "column command (circuits) cannot feed model input 'command'",
            ),
        ],
    )
