"""Joining Ray and fitting work to it: the local default, an existing cluster, worker threads."""

import atexit
import contextlib
import math
import os
import socket
import sys
import time

import ray

from qml_ray import interrupts
from qml_ray.errors import EnvironmentProblem, UsageError
from qml_ray.memory import state_bytes, worker_state_memory

# Seconds between Ray Train's polls of its workers (Ray's default: 2). A worker's ray.train.report
# waits until the previous report has been collected, so with the default every epoch shorter
# than 2 s would take 2 s. The driver's value, if set, wins.
REPORT_POLL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
REPORT_POLL_SECONDS = "0.1"
CONNECT_SECONDS = 10  # how long to wait for a Ray address to answer at all
PRESTART_ENV = "RAY_prestart_worker_first_driver"  # Ray's setting, read by the raylet a local Ray starts
# Ray's settings for the raylet of a local Ray: Ray Data's read and split tasks (0 CPUs) run in
# worker processes of their own, and Ray stops idle workers beyond one per CPU after 1 s, so on a
# machine whose CPUs the training workers hold, every epoch started a process per task again:
# 2.6 s of a 4.8 s epoch of configs/bench-16q.yaml here. Idle workers are kept a minute, and
# starting that many at once is no cause for Ray's warning on the console. Ray Train's preemption
# watcher (an actor per worker group, polling for drained nodes) has nothing to watch on the one node
# the command started: without it, a run starts one process fewer (1.4 s of CPU here).
LOCAL_RAY_SETTINGS = {
    "RAY_idle_worker_killing_time_threshold_ms": "60000",
    "RAY_worker_maximum_startup_concurrency": "8",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
}
_local_ray: list[bool] = []  # holds True once connect has started a local Ray


def job_env() -> dict:
    """Env vars for every Ray worker and actor (Ray Train's controller too): tf-keras chosen before
    TensorFlow is imported (TFQ needs it), Ray Train's poll interval, and the driver's Cloud
    Storage emulator, if set."""
    emulator = {key: os.environ[key] for key in ("STORAGE_EMULATOR_HOST",) if key in os.environ}
    return {
        "TF_USE_LEGACY_KERAS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "3",
        REPORT_POLL_ENV: os.environ.get(REPORT_POLL_ENV, REPORT_POLL_SECONDS),
        **emulator,
    }


def connect(address: str | None, log_to_driver: bool = True) -> None:
    """Join Ray: `None` joins the job's cluster when run by `ray job submit`, else starts a
    local Ray; `auto` joins the cluster that RAY_ADDRESS or this machine names; else the address.
    `log_to_driver=False` keeps the workers' output (their epoch lines), Ray's warnings and the
    cluster's error messages (a node marked dead) off this console (they stay in Ray's log files)."""
    if ray.is_initialized():
        return
    if not os.environ.get("RAY_ADDRESS"):  # empty is unset (Ray itself would take it for an address)
        os.environ.pop("RAY_ADDRESS", None)
    if address is None:  # never a cluster that `ray start` left on this machine: jobs set RAY_ADDRESS
        address = os.environ.get("RAY_ADDRESS", "local")
    target = cluster_target(os.environ.get("RAY_ADDRESS", address) if address == "auto" else address)
    if target:
        require_answer(target)
        require_same_authentication(target)
    if address == "local":
        # A new local Ray starts one idle worker process per CPU for its first driver. They lack
        # the job's env vars, so no actor of ours can use them: they would only take CPU from the
        # start (2.5 s of the tutorial config's 28 s here, BENCHMARKS.md#start-up).
        for setting, value in {PRESTART_ENV: "0", **LOCAL_RAY_SETTINGS}.items():
            os.environ.setdefault(setting, value)
    try:
        ray.init(
            address=address,
            runtime_env={"env_vars": job_env(), "worker_process_setup_hook": "qml_ray.worker_setup.start"},
            logging_level="WARNING" if log_to_driver else "ERROR",
            log_to_driver=log_to_driver,
        )
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise UsageError(f"cannot connect to Ray at {address}: {err}") from None
    interrupts.install()  # again: ray.init sets a SIGTERM handler of its own
    if not log_to_driver:
        from qml_ray import ray_internals

        ray_internals.keep_cluster_errors_off_the_console()
    if address == "local":
        _local_ray.append(True)
    else:
        release_reservations_of_ended_jobs()


def release_reservations_of_ended_jobs(own: bool = False) -> None:
    """Remove the placement groups left by jobs that have ended, but those an actor still alive asked
    for (a detached one's), saying so in one line on stderr. Ray removes a job's placement groups as
    it ends it, but keeps for good one that an actor of the job asks for meanwhile (Ray Train starting
    a killed command's workers again, say): its CPUs would stay reserved, and the next run would wait
    for them in vain. With `own` (a command whose work is done), this job's own groups too, quietly: a
    sweep's trial stopped early can leave its run's group behind. Best effort: a cluster whose state
    API does not answer (no dashboard), or answers in part, keeps them all."""
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    context = ray.get_runtime_context()
    try:
        left, mine = reservations_to_release(context.gcs_address, context.get_job_id() if own else None)
    except Exception:  # the state API's errors: from its HTTP client, its address lookup, a partial answer
        return
    for group in left + mine:
        remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group.placement_group_id))))
    if left:
        cpus = sum(bundle["unit_resources"].get("CPU", 0) for group in left for bundle in group.bundles)
        print(f"released {len(left)} reservation(s) of {cpus:g} CPU(s) left by ended jobs", file=sys.stderr)


def reservations_to_release(address: str, own_job: str | None) -> tuple[list, list]:
    """The placement groups (state API records) not removed nor detached, of jobs that have ended, which
    no actor alive asked for; and those of `own_job`, if given. An exception unless every list came whole.
    A job's live actors alone do not keep its groups: the first job on a cluster to run Ray Train or Ray
    Data starts their detached actors, which serve every later job."""
    from ray.util.state import list_actors, list_jobs, list_placement_groups

    from qml_ray import ray_internals

    listed = {"address": address, "limit": LISTED, "timeout": STATE_SECONDS}
    groups = list_placement_groups(filters=[("state", "!=", "REMOVED")], detail=True, **listed)
    groups = [group for group in groups if not group.is_detached]
    creators = ray_internals.placement_group_creators()
    ended = {job.job_id for job in list_jobs(**listed) if job.status in ENDED}
    alive = {actor.actor_id for actor in list_actors(filters=[("state", "!=", "DEAD")], **listed)}
    left = [group for group in groups if group.creator_job_id in ended]
    left = [group for group in left if creators.get(group.placement_group_id) not in alive]
    return left, [group for group in groups if own_job and group.creator_job_id == own_job]


ENDED = {"SUCCEEDED", "FAILED", "STOPPED"}  # a job's status once its driver has gone
LISTED = 10_000  # the most jobs, actors and placement groups listed (Ray's default: 100)
STATE_SECONDS = 10  # the longest each list may take


@contextlib.contextmanager
def process_as_found():
    """The caller's environment variables and working folder put back as they were when the block ends:
    joining Ray, Ray Train and Ray Tune take settings from this process's environment, and Tune from its
    working folder, which a notebook or script calling qml_ray would otherwise carry on with."""
    environment, folder = dict(os.environ), os.getcwd()
    try:
        yield
    finally:
        os.chdir(folder)
        for key in set(os.environ) - set(environment):
            del os.environ[key]
        for key, value in environment.items():
            if os.environ.get(key) != value:
                os.environ[key] = value


def leave() -> None:
    """End a command whose work is done, at once. A local Ray it started is handed to the reaper, as
    on an interrupt: ray.shutdown would wait 2-3 s here for its processes to stop, before the prompt
    comes back. On a cluster, it releases what ended jobs left reserved while it ran (a job killed
    meanwhile, whose actors asked for placement groups as they went) and what its own job still
    holds, runs the exit handlers (ray.shutdown, withdrawing a request to the autoscaler) and exits
    without tearing the interpreter down: with TensorFlow loaded, that alone took 1-2 s after the
    command's last line."""
    if _local_ray:
        interrupts.exit_now(0)
    if ray.is_initialized():
        release_reservations_of_ended_jobs(own=True)
        atexit._run_exitfuncs()  # what a normal exit runs first
        interrupts.exit_now(0)


# Ray Data's warning, before it runs a data set, when the cluster has no CPU free at that moment.
NO_FREE_CPU_WARNING = "Warning: The Ray cluster currently does not have any available CPUs."


def quiet_ray_data(verbose: bool) -> None:
    """Keep Ray Data's progress lines (INFO) off the console, unless `verbose`; and its warning that no
    CPU is free, which it gives when the inference actors, done, have not yet given theirs back (a false
    alarm: the commands wait for the capacity they need themselves, within --capacity-timeout)."""
    if not verbose:
        import logging

        import ray.data  # noqa: F401  (it sets its loggers' levels on import)

        logging.getLogger("ray.data").setLevel(logging.WARNING)
        logging.getLogger("ray.data.dataset").addFilter(not_the_no_free_cpu_warning)


def not_the_no_free_cpu_warning(record) -> bool:
    """A logging filter: every record of Ray Data's but NO_FREE_CPU_WARNING."""
    return not record.getMessage().startswith(NO_FREE_CPU_WARNING)


def cluster_target(address: str) -> str | None:
    """The host:port a Ray address names (`ray://` stripped), or None for the addresses Ray resolves
    itself (local, auto) and for what is not host:port."""
    target = address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    return target if host and port.isdigit() and "://" not in target else None


def require_answer(target: str) -> None:
    """Fail within CONNECT_SECONDS, naming `target` (host:port), when nothing listens there (Ray
    itself would retry for minutes)."""
    host, _, port = target.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as err:
        raise UsageError(f"cannot connect to Ray at {target}: nothing answers there ({err})") from None


TOKEN_PLACES = "~/.ray/auth_token, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"


def require_same_authentication(target: str) -> None:
    """Fail in one line, naming what to set, when this shell's Ray token authentication (RAY_AUTH_MODE,
    its token) is not that of the cluster whose GCS is at `target`: Ray would retry for 20 s, or join
    and then lose every actor it starts. A GCS that does not answer the question is left to Ray."""
    from qml_ray import ray_internals

    token_on, token = ray_internals.token_authentication()
    cluster_on = ray_internals.gcs_refuses(target, None, CONNECT_SECONDS)
    mode = f"RAY_AUTH_MODE={os.environ['RAY_AUTH_MODE']}" if os.environ.get("RAY_AUTH_MODE") else "RAY_AUTH_MODE unset"
    if cluster_on and not token_on:
        raise EnvironmentProblem(
            f"the Ray cluster at {target} uses token authentication and this shell does not ({mode}): "
            f"set RAY_AUTH_MODE=token, with the cluster's token in {TOKEN_PLACES}"
        )
    if cluster_on is False and token_on:
        raise EnvironmentProblem(
            f"the Ray cluster at {target} does not use token authentication and this shell does ({mode}): "
            "set RAY_AUTH_MODE=disabled to join it"
        )
    if cluster_on and token is None:
        raise EnvironmentProblem(
            f"the Ray cluster at {target} uses token authentication and this shell finds no token in "
            f"{token_source()}: put the cluster's token in {TOKEN_PLACES}"
        )
    if cluster_on and ray_internals.gcs_refuses(target, token, CONNECT_SECONDS):
        raise EnvironmentProblem(
            f"the Ray cluster at {target} refuses this shell's token (from {token_source()}): "
            f"give the cluster's token in {TOKEN_PLACES}"
        )


def token_source() -> str:
    """Where Ray takes this process's token from: RAY_AUTH_TOKEN, else RAY_AUTH_TOKEN_PATH, else its default file."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    return os.environ.get("RAY_AUTH_TOKEN_PATH") or "~/.ray/auth_token"


def require_state_memory(qubits: int, threads: int, what: str, remedy: str) -> None:
    """A UsageError unless the cluster's node of most memory holds the state vectors of one process
    simulating `qubits` qubits on `threads` threads, sized as the process sizes them (`memory.state_bytes`
    in `memory.worker_state_memory` of the node's memory and CPUs): as many circuits at once as fit that
    share, so only one circuit too large for it fails; `what` names the process."""
    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    hosts = [node for node in nodes if node.get("CPU", 0) >= threads] or nodes  # not a head of no CPUs
    node = max(hosts, key=lambda resources: share_of(resources, threads), default={})
    memory = share_of(node, threads)
    need = state_bytes(qubits, threads, memory)
    if need > memory:
        raise UsageError(
            f"{what}'s state vectors ({qubits} qubits, {threads} thread(s)) need {need / 2**30:.3g} GiB of "
            f"memory, more than the largest Ray node has for a process of {threads} CPU(s) ({memory / 2**30:.3g} "
            f"GiB of its {node.get('memory', 0) / 2**30:.3g}): {remedy}, or add larger nodes"
        )


def share_of(resources: dict, threads: int) -> int:
    """The bytes a process of `threads` CPUs on a Ray node of these resources gives its state vectors."""
    return worker_state_memory(resources.get("memory", 0), resources.get("CPU", 0) or threads, threads)


def placeable_workers(cpus_per_worker: int) -> int:
    """How many workers of `cpus_per_worker` CPUs the live nodes can hold at once."""
    return sum(int(node["Resources"].get("CPU", 0) // cpus_per_worker) for node in ray.nodes() if node["Alive"])


# While the cluster grows: how often its capacity is asked again (one GCS call), and how often the
# unchanged count is said again. A node that joins is used within a second, not up to 10 s later.
CAPACITY_POLL_SECONDS = 1.0
CAPACITY_SAY_SECONDS = 10.0


def require_capacity(count: int, cpus_each: int, what: str, remedy: str, timeout: float = 0) -> int:
    """Make sure the cluster can place `count` processes of `cpus_each` CPUs: ask the autoscaler
    (if any) for them, wait up to `timeout` seconds, then fail with a UsageError rather than hang.
    `what` names the processes in the messages, `remedy` says what the user can change.
    Return how many such processes the cluster can place."""
    fits = placeable_workers(cpus_each)
    if fits < count and timeout > 0:
        from ray.autoscaler.sdk import request_resources

        request_resources(bundles=[{"CPU": cpus_each}] * count)
        atexit.unregister(withdraw_capacity_request)  # registered once, however often the command asks
        atexit.register(withdraw_capacity_request)
        interrupts.on_interrupt(withdraw_capacity_request)
        deadline = time.monotonic() + timeout
        said, said_at = None, 0.0
        while fits < count and (now := time.monotonic()) < deadline:
            if fits != said or now - said_at >= CAPACITY_SAY_SECONDS:
                print(f"waiting for the cluster to grow: {fits} of {count} {what} placeable", flush=True)
                said, said_at = fits, now
            time.sleep(min(CAPACITY_POLL_SECONDS, max(0.0, deadline - now)))
            fits = placeable_workers(cpus_each)
    if fits < count:
        total = int(ray.cluster_resources().get("CPU", 0))
        raise UsageError(
            f"the Ray cluster ({total} CPUs) can place {fits} process(es) of {cpus_each} CPU(s), "
            f"not {count} {what}{f' after {timeout:.0f} s' if timeout else ''}: {remedy}, or add nodes"
        )
    return fits


def withdraw_capacity_request() -> None:
    """Withdraw what require_capacity asked the autoscaler for, when the command ends (at exit or on
    an interrupt: however it ends, short of being killed). Ray's autoscaler v2, KubeRay's default,
    keeps a request in the GCS until another replaces it, and with it the nodes it brought, after
    the job is gone."""
    if ray.is_initialized():  # runs before ray.shutdown: atexit calls the later-registered first
        from ray.autoscaler.sdk import request_resources

        request_resources(bundles=[])


def worker_env(cpus: int, size_pools: bool = True) -> dict:
    """Runtime env vars for a TensorFlow process given `cpus` CPUs: with `size_pools`, its thread
    pools sized to them, else TensorFlow's defaults (every core of the machine).
    (Importing TFQ starts TensorFlow, so the pools are sized by env var, not tf.config.)"""
    pools = {"TF_NUM_INTRAOP_THREADS": str(cpus), "TF_NUM_INTEROP_THREADS": str(cpus)} if size_pools else {}
    return {**job_env(), **pools}


IDLE_THREADS_WARNING_SHARE = 0.1


def idle_thread_share(circuits: int, batch_size: int, threads: int) -> float:
    """Share of a worker's thread time left idle by its training steps over `circuits` circuits:
    the simulators run one circuit per thread, in rounds, so 32 circuits on 15 threads take
    3 rounds (15, 15 and 2 circuits) and leave 29% idle."""
    steps = [min(batch_size, circuits - start) for start in range(0, circuits, batch_size)]
    rounds = sum(math.ceil(step / threads) for step in steps)
    return 1 - circuits / (rounds * threads)


def thread_rounds_warning(train_examples: int, workers: int, batch_size: int, threads: int) -> str | None:
    """A one-line warning when the largest worker shard's steps leave more than 10% of the
    worker's `threads` idle, else None."""
    circuits = math.ceil(train_examples / workers)
    idle = idle_thread_share(circuits, batch_size, threads)
    if idle <= IDLE_THREADS_WARNING_SHARE:
        return None
    per_step = min(batch_size, circuits)
    return (
        f"warning: {idle:.0%} of each worker's {threads} threads idle in training: a step's {per_step} circuits run "
        f"one per thread, in {math.ceil(per_step / threads)} rounds; make the circuits per step (batch_size, or the "
        f"{circuits} of a worker's shard) a multiple of cpus_per_worker"
    )
