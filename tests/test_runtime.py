"""Thread rounds: the share of a worker's threads its steps leave idle, and the warning about it;
a job's workers find their own cluster beside another Ray on the machine; joining a cluster releases
what ended jobs left reserved there; the garbage collector kept out of a worker's imports; Ray Data's
false alarm of no free CPU kept off the console."""

import ast
import gc
import inspect
import logging
import subprocess
import sys
from logging.handlers import BufferingHandler

import pytest

from qml_ray import config as config_lib, runtime, worker_setup
from qml_ray.train import warn_idle_threads

from conftest import ROOT, command_env


@pytest.mark.parametrize(
    "circuits, batch, threads, idle",
    [
        (32, 32, 15, 1 - 32 / 45),  # 3 rounds: 15, 15, 2
        (22, 32, 15, 1 - 22 / 30),  # the shard is the step: 2 rounds, 15 and 7
        (15, 15, 15, 0),
        (84, 32, 1, 0),  # one thread: every round is full
        (6, 3, 2, 1 - 6 / 8),  # steps of 3 on 2 threads: 2 rounds each
        (8, 4, 2, 0),
    ],
)
def test_idle_thread_share(circuits, batch, threads, idle):
    assert runtime.idle_thread_share(circuits, batch, threads) == pytest.approx(idle)


@pytest.mark.parametrize("name", ["smoke", "tutorial", "qcnn-23q", "bench-16q", "bench-20q"])
def test_shipped_configs_fill_their_thread_rounds(name):
    config = config_lib.load(ROOT / "configs" / f"{name}.yaml")
    circuits = -(-config_lib.split_sizes(config)[0] // config.workers)
    assert runtime.idle_thread_share(circuits, config.batch_size, config.cpus_per_worker) <= 0.1


def test_one_warning_line_when_a_tenth_of_the_threads_would_idle(capsys):
    warn_idle_threads(config_lib.Config(qubits=23, examples=1000, workers=32, batch_size=32, cpus_per_worker=15))
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("warning: 27% of each worker's 15 threads idle in training: a step's 22 circuits")
    warn_idle_threads(config_lib.Config(qubits=23, examples=1000, workers=47, batch_size=15, cpus_per_worker=15))
    warn_idle_threads(config_lib.Config(workers=32, batch_size=32, cpus_per_worker=15, size_thread_pools=False))
    assert capsys.readouterr().err == ""


def driver(script: str, *args: str) -> str:
    """Run `script` (a job's driver) with `args`; its output, once it has exited with status 0."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args], env=command_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout.strip()


# A command's local Ray; in one of its workers, a state API call without an address (as Ray Train's
# placement-group cleaner makes): it must answer from this Ray, whatever else runs on the machine.
OWN_CLUSTER = """
import ray
from qml_ray import runtime

runtime.connect(None)


@ray.remote
def nodes_seen():
    from ray.util.state import list_nodes

    return [node.node_id for node in list_nodes()]


print(ray.get(nodes_seen.remote()) == [ray.get_runtime_context().get_node_id()])
"""


def test_a_jobs_workers_ask_their_own_cluster_beside_another_ray(shared_cluster):
    """Ray alone would find both this local Ray and the shared cluster, and fail."""
    assert driver(OWN_CLUSTER) == "True"


# A job whose actor asks for a placement group every few milliseconds until Ray ends it: the ones
# Ray accepts while ending the job outlive it (as Ray Train's restart of a killed command's workers did).
# It also starts a detached actor that holds nothing and outlives it, in place of the last job's (as the
# first job on a cluster to run Ray Train starts Ray Train's state actor).
LEAVER = """
import os, sys, threading, time
import ray
from ray.util.placement_group import placement_group

ray.init(address=sys.argv[1])


@ray.remote(num_cpus=0)
class Service:
    def ready(self):
        return True


try:
    ray.kill(ray.get_actor("service", namespace="test_runtime"))
except ValueError:  # none yet
    pass
ray.get(Service.options(name="service", namespace="test_runtime", lifetime="detached").remote().ready.remote())


@ray.remote(num_cpus=0)
class Reserver:
    def start(self):
        def reserve():
            while True:
                placement_group([{"CPU": 0.01}])
                time.sleep(0.005)

        threading.Thread(target=reserve, daemon=True).start()


ray.get(Reserver.remote().start.remote())
time.sleep(0.5)
os._exit(0)
"""
# A job that ends leaving a detached actor holding a placement group it asked for: in use, not left.
KEEPER = """
import sys
import ray
from ray.util.placement_group import placement_group

ray.init(address=sys.argv[1])


@ray.remote(num_cpus=0)
class Keeper:
    def reserve(self):
        self.group = placement_group([{"CPU": 0.01}])
        return self.group.id.hex()


keeper = Keeper.options(name="keeper", namespace="test_runtime", lifetime="detached").remote()
print(ray.get(keeper.reserve.remote()))
"""


def test_joining_a_cluster_releases_what_ended_jobs_left_reserved(shared_cluster, shared_ray, capfd):
    """Ray's race is tried up to 5 times (it leaves a reservation nearly every time here); the
    reservations the ended job's own actors asked for are released though a detached actor of that
    job lives on; the one a detached actor asked for is kept."""
    import ray

    for _ in range(5):
        driver(LEAVER, shared_ray)
        if left := [what for what in shared_cluster.idle() if what.startswith("placement group")]:
            break
    assert left, "Ray kept no placement group of the ended job: the race this test needs did not happen"
    kept = driver(KEEPER, shared_ray)
    capfd.readouterr()
    runtime.connect(shared_ray, log_to_driver=False)
    try:
        err = capfd.readouterr().err
        assert f"released {len(left)} reservation(s) of {0.01 * len(left):g} CPU(s) left by ended jobs" in err, err
        still = ["actor Keeper (ALIVE)", "actor Service (ALIVE)", f"placement group {kept} (CREATED)"]
        assert sorted(shared_cluster.idle()) == still
    finally:
        for name in ("keeper", "service"):  # the keeper's reservation goes with it
            ray.kill(ray.get_actor(name, namespace="test_runtime"))
        ray.shutdown()


def test_the_collector_pauses_for_the_body_and_what_it_made_is_frozen_after():
    """What the body makes is out of every later collection; the collector runs again after it, unless
    the caller had paused it."""
    with worker_setup.collector_paused():
        assert not gc.isenabled()
        made = [[] for _ in range(1000)]  # lists: objects the collector tracks
        frozen = gc.get_freeze_count()
    assert gc.isenabled() and gc.get_freeze_count() >= frozen + len(made)
    gc.disable()
    try:
        with worker_setup.collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_ray_datas_warning_that_no_cpu_is_free_is_kept_off_a_quiet_console_and_only_it():
    """Ray Data warns, before running a data set, when no CPU is free at that moment, as when the inference
    actors, done, still hold theirs: a command not --verbose drops that warning (Ray Data's own text, read
    from its module's source), and keeps Ray Data's others."""
    from ray.data import dataset

    source = ast.parse(inspect.getsource(dataset))
    texts = [node.value for node in ast.walk(source) if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    [warning] = [text for text in texts if text.startswith(runtime.NO_FREE_CPU_WARNING)]
    logger, seen = logging.getLogger("ray.data.dataset"), BufferingHandler(10)
    level = logging.getLogger("ray.data").level
    logger.addHandler(seen)
    try:
        runtime.quiet_ray_data(verbose=False)
        logger.warning(warning)
        logger.warning("another warning of Ray Data's")
    finally:
        logger.removeHandler(seen)
        logger.removeFilter(runtime.not_the_no_free_cpu_warning)
        logging.getLogger("ray.data").setLevel(level)
    assert [record.getMessage() for record in seen.buffer] == ["another warning of Ray Data's"]
