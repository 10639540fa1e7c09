"""Every user mistake: one clear error line, exit status 2 within a minute, no traceback, and
nothing written or changed anywhere (the whole temporary tree is compared before and after)."""

import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from qml_ray import config as config_lib, storage
from qml_ray.errors import ENVIRONMENT_STATUS, MAX_LINE, USAGE_STATUS, ModelError, UsageError, one_line

from conftest import CPUS, SMOKE, command_env, free_port, run_command

MISTAKE_SECONDS = 60  # a mistake is reported within this (a Ray address where nobody answers too)
IMAGE = "us-docker.pkg.dev/my-project/qml-ray/qml-ray:0.1.0@sha256:" + "0123456789abcdef" * 4
RENDER = ("render", "--config", SMOKE, "--image", IMAGE, "--bucket", "my-bucket")


def snapshot(folder: Path) -> dict:
    """Every file and folder below `folder` with its size and modification time."""
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")} if folder.exists() else {}


def assert_usage_error(done, message: str) -> None:
    assert_error(done, message, USAGE_STATUS)


def assert_error(done, message: str, status: int) -> None:
    """The command ended with `status` and one error line holding `message`, and no traceback."""
    stderr = done.stderr.strip()
    assert done.returncode == status, done.stdout[-2000:] + stderr[-2000:]
    assert "Traceback" not in stderr and "Traceback" not in done.stdout
    assert stderr.splitlines()[-1].startswith("error: "), stderr[-2000:]
    assert message in stderr.splitlines()[-1], stderr[-2000:]


@pytest.fixture(scope="module")
def circuits(tmp_path_factory) -> Path:
    """Parquet files of inference data with something wrong, for a 4-qubit model."""
    import cirq
    import tensorflow_quantum as tfq

    folder = tmp_path_factory.mktemp("circuits")
    outside = tfq.convert_to_tensor([cirq.Circuit(cirq.X(cirq.GridQubit(0, 7)))]).numpy()[0]
    labelled = tfq.convert_to_tensor([cirq.Circuit(cirq.X(cirq.GridQubit(0, i))) for i in range(4)]).numpy()
    ones = pa.array([1.0] * 4)
    tables = {
        "labelled": {"circuit": pa.array(labelled), "label": pa.array([1.0, -1.0, 1.0, -1.0])},
        "wide-labels": {
            "circuit": pa.array(labelled),
            "label": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(12, np.float32)), 3),
        },
        "no-circuit": {"id": pa.array([1, 2])},
        "int-circuit": {"circuit": pa.array([1, 2])},
        "garbage": {"circuit": pa.array([b"garbage"])},
        "pauli-sum": {"circuit": pa.array([b""])},  # TFQ reads empty bytes as an empty PauliSum
        "other-qubits": {"circuit": pa.array([outside])},
        "empty": {"circuit": pa.array([], pa.binary())},
        "commanded": {"circuit": pa.array(labelled), "command": pa.array([0.5] * 4), "label": ones},
        "command-bytes": {"circuit": pa.array(labelled), "command": pa.array([b"x"] * 4), "label": ones},
        "features-3": {"features": pa.array([[0.1, 0.2, 0.3]] * 4, pa.list_(pa.float32(), 3)), "label": ones},
        "ragged": {"features": pa.array([[0.1, 0.2], [0.3]]), "label": pa.array([1.0, 0.0])},
    }
    for name, columns in tables.items():
        pq.write_table(pa.table(columns), folder / f"{name}.parquet")
    (folder / "text.parquet").write_text("id,circuit\n1,abc\n")
    return folder


@pytest.fixture
def tree(tmp_path, circuits) -> dict:
    """The temporary tree a mistake runs in, and the paths its arguments name: `file` (a file),
    `run` (a run folder with a 4-qubit config and nothing else), `controlled` and `pair` (the same, of
    mymodels' models of classical inputs), `data` (bad inference data),
    `configs` (bad config files), `work` (the command's working folder)."""
    paths = {name: tmp_path / name for name in ("file", "run", "controlled", "pair", "data", "configs", "work")}
    paths["file"].write_text("a file, not a folder\n")
    models = {"run": config_lib.DEFAULT_MODEL, "controlled": "mymodels:controlled", "pair": "mymodels:pair"}
    for run, model in models.items():
        paths[run].mkdir()
        (paths[run] / storage.CONFIG).write_text(config_lib.load(SMOKE).replace(model=model).to_yaml())
    shutil.copytree(circuits, paths["data"])
    paths["configs"].mkdir()
    configs = {
        "unknown-key": "qubits: 6\nqbits: 4\n",
        "unparsable": "qubits: [6\n",
        "negative": "epochs: -3\n",
        "list": "- qubits\n- 6\n",
        "huge": "qubits: 38\nepochs: 2\n",
    }
    for name, text in configs.items():
        (paths["configs"] / f"{name}.yaml").write_text(text)
    (paths["configs"] / "binary.yaml").write_bytes(bytes(range(128, 256)))
    paths["work"].mkdir()
    for module, text in USER_MODULES.items():
        (paths["work"] / f"{module}.py").write_text(text)
    return {"tmp": tmp_path, **paths, "smoke": SMOKE}


# The user's model modules in the working folder of every case.
USER_MODULES = {
    "mymodels": """
import cirq
import sympy
import tensorflow as tf
import tensorflow_quantum as tfq


def tiny(depth=1):
    qubit = cirq.GridQubit(0, 0)
    circuits = tf.keras.Input(shape=(), dtype=tf.string)
    readout = tfq.layers.PQC(cirq.Circuit(cirq.ry(sympy.Symbol("w"))(qubit)), cirq.Z(qubit))(circuits)
    model = tf.keras.Model(circuits, tf.keras.layers.Dense(1)(readout))
    model.compile("adam", loss="mse")
    return model


def controlled(span=1):  # a circuit and a command, whose Dense layer gives the angle (of `span` qubits)
    qubits = cirq.GridQubit.rect(1, span)
    circuits = tf.keras.Input(shape=(), dtype=tf.string, name="circuit")
    command = tf.keras.Input(shape=(1,), name="command")
    circuit = cirq.Circuit(cirq.ry(sympy.Symbol("w"))(qubits[0]), cirq.X.on_each(qubits[1:]))
    readout = tfq.layers.ControlledPQC(circuit, cirq.Z(qubits[0]))([circuits, tf.keras.layers.Dense(1)(command)])
    model = tf.keras.Model([circuits, command], readout)
    model.compile("adam", loss="mse")
    return model


def wide():
    return controlled(span=34)


def pair():  # two features and no circuit: their Dense layer gives the angle, on empty circuits
    qubit = cirq.GridQubit(0, 0)
    points = tf.keras.Input(shape=(2,), name="features")
    empty = tf.repeat(tfq.convert_to_tensor([cirq.Circuit()]), tf.shape(points)[0])
    layer = tfq.layers.ControlledPQC(cirq.Circuit(cirq.ry(sympy.Symbol("w"))(qubit)), cirq.Z(qubit))
    model = tf.keras.Model(points, layer([empty, tf.keras.layers.Dense(1)(points)]))
    model.compile("adam", loss="mse")
    return model


def not_a_model():
    return 42


def failing_callbacks(rank, run):
    raise ValueError("no such dashboard")
""",
    "broken": "def build(:\n",
    "failing": "import a_package_nobody_installed\n\n\ndef build():\n    pass\n",
}


def mistake(command: str, *args, message: str, env: dict | None = None, ray: bool = False, id: str):
    """A battery case: `python -m qml_ray.<command> args...` (with {tmp}, {file}, {run}, {data},
    {configs}, {smoke}, {port}, a port where nobody answers, and {cluster}, the shared cluster, filled in)
    must fail with `message`; run in this process, or, with `ray` (it asks Ray to find the mistake), in its own."""
    return pytest.param(command, args, message, env or {}, ray, id=id)


TRAIN = ("train", "--config", "{smoke}", "--storage", "{tmp}/runs")
SWEEP = ("sweep", "--config", "{smoke}", "--storage", "{tmp}/runs")
CLI = "unrecognized arguments"
MODEL = ("train", "--model", "mymodels:tiny", "--storage", "{tmp}/runs")
SHARED = ("--address", "{cluster}")  # a case that asks Ray attaches to the shared cluster
MISTAKES = [
    # train: the model and data contracts
    mistake("train", "--model", "mymodels", message="model must be MODULE:FUNCTION", id="model-no-function"),
    mistake("train", "--model", "nowhere:build", message="model module 'nowhere' not found", id="model-no-module"),
    mistake(
        "train",
        "--model",
        "broken:build",
        message="cannot import model module 'broken': SyntaxError",
        id="model-syntax",
    ),
    mistake("train", "--model", "mymodels:missing", message="has no function 'missing'", id="model-no-such-function"),
    mistake("train", "--callbacks", "mymodels", message="callbacks must be MODULE:FUNCTION", id="callbacks-spec"),
    mistake("train", "--callbacks", "no:cb", message="callbacks module 'no' not found", id="callbacks-no-module"),
    mistake(*MODEL, "--param", "width=3", message="takes no parameter 'width'", id="model-unknown-param"),
    mistake(*MODEL, "--param", "depth", message="--param takes KEY=VALUE", id="param-without-value"),
    mistake(*MODEL, "--param", "qubits=5", message="param 'qubits' is a config key", id="param-is-a-config-key"),
    mistake(*MODEL, "--data", "{tmp}/none", message="no data at", id="data-missing"),
    mistake(*MODEL, "--data", "{data}/text.parquet", message="as Parquet", id="data-not-parquet"),
    mistake(*MODEL, "--data", "{data}/empty.parquet", message="has no rows", id="data-no-rows"),
    mistake(  # a model's circuit column, if it takes one, only its workers know: the label the driver does
        *(*MODEL, "--data", "{data}/no-circuit.parquet"),
        message="has no 'label' column (its columns: id)",
        id="data-ids-only",
    ),
    mistake(*MODEL, "--data", "{data}/other-qubits.parquet", message="has no 'label' column", id="data-no-label"),
    mistake(*MODEL, "--validation-data", "{data}/labelled.parquet", message="needs data", id="validation-alone"),
    mistake(
        "sweep",
        "--model",
        "mymodels:tiny",
        "--grid",
        "param.width=1,2",
        message="takes no parameter 'width'",
        id="sweep-unknown-param",
    ),
    # train: config values and flags
    mistake("train", "--qubits", "3", message="qubits must be at least 4", id="train-qubits-3"),
    mistake(*TRAIN, "--qubits", "39", message="qubits must be at most 38", id="train-qubits-beyond-any-machine"),
    mistake("train", "--workers", "0", message="workers must be at least 1", id="train-workers-0"),
    mistake("train", "--epochs", "0", message="epochs must be at least 1", id="train-epochs-0"),
    mistake("train", "--workers", "two", message="workers must be a whole number, got 'two'", id="train-workers-two"),
    mistake("train", "--layers", "9", message="layers must be 1..3 for 8 qubits", id="train-layers-9"),
    mistake("train", "--resume", message="--resume needs the --name", id="train-resume-without-name"),
    mistake("train", "--learning-rate", "fast", message="learning_rate must be a number", id="train-rate-text"),
    mistake("train", "--learning-rate", "inf", message="learning_rate must be a finite number", id="train-rate-inf"),
    mistake("train", "--seed", "-1", message="seed must be at least 0", id="train-seed-negative"),
    mistake("train", "--test-fraction", "1.5", message="test_fraction must be between 0 and 1", id="train-fraction"),
    mistake(
        "train", "--size-thread-pools", "maybe", message="size_thread_pools must be true or false", id="train-bool"
    ),
    mistake("train", "--hidden-activation", "sigmoid", message="hidden_activation must be one of", id="train-choice"),
    mistake("train", "--profile-steps", "8,5", message="profile_steps must be START,STOP", id="train-profile-steps"),
    mistake("train", "--profiler-port", "80", message="profiler_port must be 0 (off) or 1024..", id="train-port"),
    mistake("train", "--frobnicate", message=f"{CLI}: --frobnicate", id="train-unknown-flag"),
    # train: config files
    mistake("train", "--config", "{configs}/missing.yaml", message="config file not found", id="config-missing"),
    mistake("train", "--config", "{configs}", message="cannot read config file", id="config-is-a-folder"),
    mistake("train", "--config", "{configs}/binary.yaml", message="cannot read config file", id="config-binary"),
    mistake(
        "train", "--config", "{configs}/unparsable.yaml", message="cannot read config file", id="config-unparsable"
    ),
    mistake("train", "--config", "{configs}/unknown-key.yaml", message="unknown config key(s): qbits", id="config-key"),
    mistake("train", "--config", "{configs}/negative.yaml", message="epochs must be at least 1", id="config-value"),
    mistake("train", "--config", "{configs}/list.yaml", message="must hold a mapping", id="config-not-a-mapping"),
    # train: run names that are not one folder name
    mistake(*TRAIN, "--name", "../escape", message="--name must be one folder name", id="name-climbs-out"),
    mistake(*TRAIN, "--name", "", message="--name must be one folder name", id="name-empty"),
    mistake(*TRAIN, "--name", "a/b", message="--name must be one folder name", id="name-with-separator"),
    mistake(*TRAIN, "--name", ".", message="--name must be one folder name", id="name-is-the-storage"),
    mistake(*TRAIN, "--name", "{tmp}/elsewhere", message="--name must be one folder name", id="name-absolute"),
    mistake(*TRAIN, "--name", "n" * 300, message="--name must be at most 255 bytes (UTF-8), not 300", id="name-long"),
    mistake(
        *TRAIN, "--name", "名" * 86, message="--name must be at most 255 bytes (UTF-8), not 258", id="name-long-utf8"
    ),
    # train: storage that cannot hold a run
    mistake("train", "--storage", "", message="storage must not be empty", id="storage-empty"),
    mistake("train", "--storage", "gs:/bucket/runs", message="unsupported storage", id="storage-gs-malformed"),
    mistake("train", "--storage", "s3://bucket/runs", message="unsupported storage", id="storage-s3"),
    mistake("train", "--storage", "{file}", message="is a file", id="storage-is-a-file"),
    mistake("train", "--storage", "{file}/runs", message="is a file", id="storage-below-a-file"),
    mistake(*TRAIN[:3], "--storage", "/proc/qml-runs", message="cannot create the folder", id="storage-not-creatable"),
    # train: Ray addresses and sizes the cluster can never hold
    mistake(*TRAIN, "--address", "127.0.0.1:{port}", message="Ray at 127.0.0.1:{port}", id="address-nobody"),
    mistake(
        *TRAIN,
        "--address",
        "auto",
        message="Ray at 127.0.0.1:{port}",
        env={"RAY_ADDRESS": "127.0.0.1:{port}"},
        id="address-env-nobody",
    ),
    mistake(  # an empty RAY_ADDRESS is unset: a local Ray starts, and says it is too small
        *TRAIN,
        "--workers",
        str(CPUS + 1),
        message=f"not {CPUS + 1} training workers",
        env={"RAY_ADDRESS": ""},
        ray=True,
        id="address-env-empty",
    ),
    mistake(
        *TRAIN, "--qubits", "38", *SHARED, message="more than the largest Ray node has", ray=True, id="train-memory"
    ),
    # infer
    mistake("infer", "--run", "{tmp}/nothing", message="no run at", id="infer-no-run"),
    mistake(
        "infer",
        *("--run", "{controlled}", "--data", "{data}/labelled.parquet"),
        message="model input 'command' has no column of its name (the model's inputs: circuit (circuits), "
        "command (float32 (1,)); the columns of {data}/labelled.parquet: circuit (circuits), label (number))",
        id="infer-input-without-column",
    ),
    mistake(
        "infer",
        *("--run", "{controlled}", "--data", "{data}/command-bytes.parquet"),
        message="column command (circuits) cannot feed model input 'command', which takes numbers",
        id="infer-column-of-another-kind",
    ),
    mistake(
        "infer",
        *("--run", "{pair}", "--data", "{data}/features-3.parquet"),
        message="column features (numbers of 3) does not fit model input features (float32 (2,))",
        id="infer-column-of-another-width",
    ),
    mistake(
        "infer",
        *("--run", "{pair}", "--data", "{data}/ragged.parquet"),
        message="the lists of column 'features' differ in length",
        id="infer-lists-of-different-lengths",
    ),
    mistake("infer", "--run", "{file}", message="no run at", id="infer-run-is-a-file"),
    mistake("infer", "--run", "gs:/bucket/run", message="unsupported storage", id="infer-run-malformed"),
    mistake("infer", "--run", "{run}", "--actors", "0", message="must be at least 1", id="infer-actors-0"),
    mistake("infer", "--run", "{run}", "--batch-size", "-1", message="must be at least 1", id="infer-batch-negative"),
    mistake("infer", "--run", "{run}", message="no data at", id="infer-run-without-data"),
    mistake("infer", "--run", "{run}", "--data", "{data}/none.parquet", message="no data at", id="infer-no-data"),
    mistake("infer", "--run", "{run}", "--data", "{data}/text.parquet", message="as Parquet", id="infer-not-parquet"),
    mistake(
        "infer",
        "--run",
        "{run}",
        "--data",
        "{data}/no-circuit.parquet",
        message="no 'circuit' column",
        id="infer-column",
    ),
    mistake("infer", "--run", "{run}", "--data", "{data}/int-circuit.parquet", message="not int64", id="infer-type"),
    mistake("infer", "--run", "{run}", "--data", "{data}/empty.parquet", message="has no rows", id="infer-no-rows"),
    mistake(
        "infer", "--run", "{run}", "--data", "{data}/garbage.parquet", message="not a serialized", id="infer-garbage"
    ),
    mistake(
        "infer", "--run", "{run}", "--data", "{data}/pauli-sum.parquet", message="not a serialized", id="infer-pauli"
    ),
    mistake(
        "infer",
        "--run",
        "{run}",
        "--data",
        "{data}/other-qubits.parquet",
        message="is on q(0, 7), not among the model's 4 qubits",
        id="infer-other-qubits",
    ),
    mistake(
        "infer",
        "--run",
        "{run}",
        "--data",
        "{data}/../run/config.yaml",
        message="as Parquet",
        id="infer-data-is-yaml",
    ),
    # cluster render: values GKE or KubeRay would refuse later
    mistake("cluster", *RENDER, "--bucket", "My_Bucket", message="--bucket must be", id="render-bucket-case"),
    mistake("cluster", *RENDER, "--bucket", "ab", message="--bucket must be", id="render-bucket-short"),
    mistake("cluster", *RENDER, "--bucket", "goog-runs", message="--bucket must be", id="render-bucket-goog"),
    mistake("cluster", *RENDER, "--bucket", "my-google-runs", message="--bucket must be", id="render-bucket-google"),
    mistake("cluster", *RENDER, "--bucket", "192.168.1.1", message="--bucket must be", id="render-bucket-ip"),
    mistake("cluster", *RENDER, "--bucket", "b" * 64, message="--bucket must be", id="render-bucket-long"),
    mistake("cluster", *RENDER, "--name", "QCNN", message="--name must be", id="render-name-case"),
    mistake("cluster", *RENDER, "--name", "q" * 42, message="--name must be 1-41", id="render-name-long"),
    mistake("cluster", *RENDER, "--name", "9lives", message="--name must be", id="render-name-digit-first"),
    mistake("cluster", *RENDER, "--namespace", "QML_Ray", message="--namespace must be", id="render-namespace"),
    mistake("cluster", *RENDER, "--image", "", message="--image must name the image by digest", id="render-no-image"),
    mistake("cluster", *RENDER, "--image", "qml-ray:0.1.0", message="by digest", id="render-image-tag"),
    mistake("cluster", *RENDER, "--image", "Qml Ray@sha256:00", message="by digest", id="render-image-malformed"),
    mistake("cluster", *RENDER, "--workers", "0", message="workers must be at least 1", id="render-workers-0"),
    mistake("cluster", *RENDER, "--out", "{file}", message="is a file", id="render-out-is-a-file"),
    mistake("cluster", *RENDER[:2], "{configs}/nope.yaml", *RENDER[3:], message="not found", id="render-no-config"),
    # bench
    mistake("bench", "circuits", "--qubits", "3", message="numbers of at least 4", id="circuits-qubits-3"),
    mistake("bench", "circuits", "--qubits", "8,39", message="at most 38", id="circuits-qubits-beyond"),
    mistake(
        "bench", "circuits", "--qubits", "38", "--out", "{tmp}/c", message="more than this machine", id="circuits-mem"
    ),
    mistake("bench", "circuits", "--out", "{file}", message="is a file", id="circuits-out-is-a-file"),
    mistake("bench", "circuits", "--threads", "0", message="a positive number", id="circuits-threads-0"),
    mistake(
        "bench", "circuits", "--efficiency-from", "{file}", message="cannot read a runtimes.json", id="circuits-json"
    ),
    mistake("bench", "runtimes", "--workers", "0", message="numbers of at least 1", id="runtimes-workers-0"),
    mistake("bench", "runtimes", "--epochs", "1", message="at least 2 epochs", id="runtimes-epochs-1"),
    mistake("bench", "runtimes", "--runtimes", "docker", message="expected some of", id="runtimes-unknown"),
    mistake("bench", "runtimes", "--workers", "100000", message="more than this machine's", id="runtimes-cpus"),
    mistake("bench", "runtimes", "--out", "{file}", message="is a file", id="runtimes-out-is-a-file"),
    mistake(
        "bench", "runtimes", "--config", "{configs}/huge.yaml", message="more than this machine", id="runtimes-memory"
    ),
    mistake("bench", "spin", message="invalid choice", id="bench-unknown-command"),
    mistake("bench", "classical", "--epochs", "1", message="at least 2 epochs", id="classical-epochs-1"),
    mistake("bench", "classical", "--qubits", "1", message="numbers of at least 2", id="classical-qubits-1"),
    # sweep
    mistake(*SWEEP, "--grid", "qbits=4,6", message="unknown config key 'qbits'", id="sweep-unknown-key"),
    mistake(*SWEEP, "--grid", "qubits=3,4", message="qubits must be at least 4", id="sweep-bad-value"),
    mistake(*SWEEP, "--grid", "qubits", message="--grid takes KEY=VALUE,VALUE", id="sweep-grid-without-values"),
    mistake(*SWEEP, "--grid", "storage=a,b", message="storage cannot be swept", id="sweep-storage"),
    mistake(*SWEEP, "--seeds", "0", message="--seeds must be at least 1", id="sweep-seeds-0"),
    mistake(*SWEEP, "--max-concurrent", "0", message="--max-concurrent must be at least 1", id="sweep-concurrent-0"),
    mistake(*SWEEP, "--early-stop", "speed", message="invalid choice", id="sweep-early-stop-metric"),
    mistake(*SWEEP, "--resume", message="--resume needs the --name", id="sweep-resume-without-name"),
    mistake(*SWEEP, "--name", "../up", message="--name must be one folder name", id="sweep-name-climbs-out"),
    mistake(*SWEEP, "--name", "", message="--name must be one folder name", id="sweep-name-empty"),
    mistake(*SWEEP, "--name", "n" * 256, message="--name must be at most 255 bytes", id="sweep-name-long"),
    mistake(*SWEEP[:3], "--storage", "{file}", message="is a file", id="sweep-storage-is-a-file"),
]


@pytest.mark.parametrize("command, args, message, env, ray", MISTAKES)
def test_mistake(tree, in_process, request, command, args, message, env, ray):
    port = str(free_port())
    fill = {**{name: str(path) for name, path in tree.items()}, "port": port}
    if "{cluster}" in args:
        fill["cluster"] = request.getfixturevalue("shared_ray")
    args = [str(arg).format(**fill) for arg in args]
    env = {key: value.format(**fill) for key, value in env.items()}
    before = snapshot(tree["tmp"])
    started = time.monotonic()
    if ray:
        done = run_command(command, *args, timeout=MISTAKE_SECONDS, env=command_env(**env), cwd=tree["work"])
    else:
        done = in_process(command, *args, cwd=tree["work"], env=env)
    assert time.monotonic() - started < MISTAKE_SECONDS
    assert_usage_error(done, message.format(**fill))
    assert snapshot(tree["tmp"]) == before


def test_more_workers_than_the_cluster_can_place_fails_at_once(tmp_path, shared_ray):
    options = ("--workers", CPUS + 1, "--storage", tmp_path, "--address", shared_ray)
    done = run_command("train", "--config", SMOKE, *options, timeout=120)
    assert_usage_error(
        done,
        f"the Ray cluster ({CPUS} CPUs) can place {CPUS} process(es) of 1 CPU(s), "
        f"not {CPUS + 1} training workers: lower --workers or --cpus-per-worker, or add nodes",
    )
    assert list(tmp_path.iterdir()) == []


def test_capacity_that_never_comes_fails_after_the_timeout(tmp_path, shared_ray):
    options = ("--workers", 1, "--cpus-per-worker", CPUS + 1, "--capacity-timeout", 3, "--address", shared_ray)
    done = run_command("train", "--config", SMOKE, *options, "--storage", tmp_path, timeout=120)
    assert_usage_error(done, f"can place 0 process(es) of {CPUS + 1} CPU(s), not 1 training workers after 3 s")
    assert "waiting for the cluster to grow: 0 of 1 training workers placeable" in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_token_authentication_where_the_cluster_has_none_is_one_line(tmp_path, shared_ray):
    """The shared cluster uses no token authentication: a shell that does is told what to set, before
    anything is written or asked of the cluster (shared_ray checks that nothing is left on it)."""
    options = ("--config", SMOKE, "--storage", tmp_path, "--address", shared_ray)
    done = run_command("train", *options, env=command_env(RAY_AUTH_MODE="token"))
    assert_error(
        done,
        f"the Ray cluster at {shared_ray} does not use token authentication and this shell does "
        "(RAY_AUTH_MODE=token): set RAY_AUTH_MODE=disabled to join it",
        ENVIRONMENT_STATUS,
    )
    assert list(tmp_path.iterdir()) == []


def test_existing_run_is_never_overwritten(trained_run):
    run = trained_run.path
    before = snapshot(run)
    done = run_command("train", "--config", SMOKE, "--storage", run.parent, "--name", run.name)
    assert_usage_error(done, "already exists: choose another --name, or add --resume")
    assert snapshot(run) == before


def test_resume_refuses_another_data_set_or_model(trained_run):
    run = trained_run.path
    before = snapshot(run)
    done = run_command("train", "--storage", run.parent, "--name", run.name, "--resume", "--qubits", "6")
    assert_usage_error(done, "with another qubits")
    assert snapshot(run) == before


@pytest.fixture
def run_copy(trained_run, tmp_path) -> Path:
    """A copy of the trained run, free to damage."""
    return Path(shutil.copytree(trained_run.path, tmp_path / "copy", ignore=shutil.ignore_patterns("predictions")))


def test_resume_refuses_a_run_of_the_earlier_checkpoint_layout(run_copy):
    """Runs trained before the run folder became Ray Train's own kept its checkpoint list in checkpoints/."""
    (run_copy / storage.CHECKPOINT_LIST).rename(run_copy / storage.CHECKPOINTS / storage.CHECKPOINT_LIST)
    before = snapshot(run_copy)
    done = run_command("train", "--storage", run_copy.parent, "--name", run_copy.name, "--resume", "--epochs", 60)
    assert_usage_error(done, "an earlier qml_ray trained it")
    assert snapshot(run_copy) == before


def remove_weights(run: Path) -> None:
    shutil.rmtree(run / storage.WEIGHTS)


def corrupt_weights(run: Path) -> None:
    data_file = next((run / storage.WEIGHTS).glob("model.data-*"))
    data_file.write_bytes(b"\x00garbage" * 16)


def change_model_shape(run: Path) -> None:
    config = run / storage.CONFIG
    config.write_text(config.read_text().replace("layers: 1", "layers: 2"))


@pytest.mark.parametrize(
    "damage, message",
    [
        (remove_weights, "error: no weights in"),
        (corrupt_weights, "error: cannot load the weights in"),
        (change_model_shape, "error: cannot load the weights in"),
    ],
)
def test_infer_with_missing_corrupt_or_mismatched_weights(run_copy, in_process, damage, message):
    """Found by the command before it starts Ray: run in this process."""
    damage(run_copy)
    done = in_process("infer", "--run", run_copy)
    assert_usage_error(done, message)
    assert not (run_copy / storage.PREDICTIONS).exists()


def test_a_bad_row_met_by_the_actors_is_one_line_naming_it(run_copy, shared_ray):
    """The driver checks the data's first row; a bad row after it stops the actors with one line."""
    table = pq.read_table(run_copy / storage.DATA / "test.parquet")
    circuits = table.column("circuit").to_pylist()
    circuits[5] = b"garbage"
    bad = table.set_column(table.schema.get_field_index("circuit"), "circuit", pa.array(circuits, pa.binary()))
    pq.write_table(bad, run_copy.parent / "bad.parquet")
    before = snapshot(run_copy.parent)
    data = ("--data", run_copy.parent / "bad.parquet", "--batch-size", 4, "--address", shared_ray)
    done = run_command("infer", "--run", run_copy, *data, timeout=MISTAKE_SECONDS)
    assert_usage_error(done, f"error: the circuit of row id {table['id'][5]} is not a serialized TFQ circuit")
    assert snapshot(run_copy.parent) == before


def test_inference_on_nodes_too_small_for_its_state_vectors_is_one_line(run_copy):
    """The largest node's memory (Ray's resource: a local Ray's, made 1 KiB) cannot hold an actor's states:
    refused before any actor starts, nothing written."""
    before = snapshot(run_copy.parent)
    env = command_env(RAY_OVERRIDE_RESOURCES=json.dumps({"memory": 1024}))
    done = run_command("infer", "--run", run_copy, env=env, timeout=MISTAKE_SECONDS)
    assert_usage_error(done, "error: an inference actor's state vectors (8 qubits, 1 thread(s)) need")
    assert snapshot(run_copy.parent) == before


def damage_pages(path: Path) -> None:
    """Overwrite a Parquet file's data pages, keeping its footer (the schema and row counts) whole."""
    content = path.read_bytes()
    footer = int.from_bytes(content[-8:-4], "little") + 8
    path.write_bytes(content[:4] + b"\xff" * (len(content) - footer - 4) + content[-footer:])


def test_data_whose_rows_cannot_be_read_is_one_line(run_copy, shared_ray):
    damage_pages(run_copy / "data" / "train.parquet")  # its footer is whole: reading its rows fails
    files = lambda: {path: stat for path, stat in snapshot(run_copy).items() if path.is_file()}  # noqa: E731
    before = files()  # (the run's folder itself changes: the command claims it while it reads)
    more = ("--epochs", config_lib.of_run(str(run_copy)).epochs + 2, "--address", shared_ray)
    done = run_command("train", "--storage", run_copy.parent, "--name", run_copy.name, "--resume", *more)
    assert_usage_error(done, f"cannot read {run_copy / 'data' / 'train.parquet'} as Parquet")
    assert files() == before


def test_training_that_keeps_failing_says_how_to_continue(run_copy, shared_ray):
    train = run_copy / "data" / "train.parquet"
    table = pq.read_table(train)  # a circuit no worker can parse: every attempt fails at its step
    circuits = [b"garbage", *table.column("circuit").to_pylist()[1:]]
    pq.write_table(table.set_column(table.schema.get_field_index("circuit"), "circuit", pa.array(circuits)), train)
    more = ("--epochs", config_lib.of_run(str(run_copy)).epochs + 2, "--max-failures", 0, "--workers", 1)
    more += ("--address", shared_ray)
    done = run_command("train", "--storage", run_copy.parent, "--name", run_copy.name, "--resume", *more)
    assert done.returncode == 1
    lines = done.stderr.splitlines()  # Ray's forwarded worker logs may come in between
    assert [line for line in lines if line.startswith("error: training failed: Training failed due to worker errors")]
    assert "the checkpoints are kept: continue with --name copy --resume" in lines


def test_error_text_is_one_bounded_line():
    assert one_line(ValueError("cannot\n  open\tfile")) == "cannot open file"
    long = one_line("x " * MAX_LINE)
    assert len(long) == MAX_LINE and long.endswith("...")


@pytest.mark.parametrize(
    "model, data, message",
    [
        ("mymodels:not_a_model", "labelled", "the model function mymodels:not_a_model returned int, not a tf.keras"),
        ("mymodels:tiny", "wide-labels", "the data's labels hold 3 value(s) per circuit"),
        ("mymodels:controlled", "labelled", "model input 'command' has no column of its name"),
    ],
)
def test_what_only_a_worker_finds_wrong_with_a_model(tree, monkeypatch, model, data, message):
    """The checks a training worker makes as it builds its replica and feeds it (worker.build_replica,
    worker.model_feed), run here on the job the command hands it. How a worker's finding ends the
    command is the test below's (and test_quantum_layers' block gradient on a model that cannot take it);
    a model too large for the cluster's nodes is test_quantum_layers' memory check's."""
    import tensorflow as tf

    from qml_ray import datasets, worker

    monkeypatch.syspath_prepend(str(tree["work"]))
    monkeypatch.setattr("sys.dont_write_bytecode", True)
    source = datasets.describe(str(tree["data"] / f"{data}.parquet"))
    config = config_lib.load(SMOKE).replace(model=model)
    job = worker.Job(config, str(tree["tmp"] / "runs"), {}, source.label_width, in_memory=True, columns=source.columns)
    try:
        with pytest.raises(UsageError) as found:
            worker.model_feed(job, worker.build_replica(job, tf.distribute.get_strategy(), rank=1))
    finally:
        sys.modules.pop("mymodels", None)  # this test's folder's: another test's is another
    assert message in one_line(found.value)


@pytest.mark.slow  # a training's workers started
def test_a_model_only_the_workers_can_find_wrong_ends_in_one_line(tree, shared_cluster, shared_ray):
    """What the driver cannot see without importing the model (and TensorFlow), or calling the user's
    callbacks function (here: one that fails, as rank 0 calls it once its data is ready): the worker tells
    the command, which ends in one line, and the run it started is removed. Ray Train never starts the
    workers again meanwhile (a new reservation made as the command's job ends could outlive it)."""
    (tree["tmp"] / "runs").mkdir()
    before = snapshot(tree["tmp"])
    data = tree["data"] / "labelled.parquet"
    options = ("--workers", 1, "--epochs", 1, "--storage", tree["tmp"] / "runs", "--name", "wrong")
    options += ("--address", shared_ray)
    done = run_command(
        "train",
        *("--model", "mymodels:tiny", "--callbacks", "mymodels:failing_callbacks"),
        *("--data", data, "--validation-data", data, *options),
        timeout=300,
        env=command_env(PYTHONDONTWRITEBYTECODE="1"),
        cwd=tree["work"],
    )
    assert_usage_error(done, "the callbacks function mymodels:failing_callbacks failed: ValueError: no such dashboard")
    after = snapshot(tree["tmp"])
    del before[tree["tmp"] / "runs"], after[tree["tmp"] / "runs"]  # its time: a run folder came and went
    assert after == before and not list((tree["tmp"] / "runs").iterdir())
    [run] = [run for run in shared_cluster.train_runs() if run["name"] == "wrong"]
    assert "ERRORED" not in [attempt["status"] for attempt in run["attempts"]], run["attempts"]


def test_a_model_module_that_fails_to_import_is_named_with_its_error(tree, monkeypatch):
    from qml_ray import contract

    monkeypatch.syspath_prepend(str(tree["work"]))
    monkeypatch.setattr("sys.dont_write_bytecode", True)
    with pytest.raises(ModelError, match="cannot import model module 'failing': ModuleNotFoundError: No mod"):
        contract.resolve("failing:build")
