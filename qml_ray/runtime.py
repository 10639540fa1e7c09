"""Joining Ray and fitting work to it: the local default, an existing cluster, worker threads."""

import os

import ray

from qml_ray.errors import UsageError

def job_env() -> dict:
    """Env vars for every Ray worker and actor: tf-keras chosen before TensorFlow is imported
    (TFQ needs it), and the driver's Cloud Storage emulator, if it uses one."""
    passed = {key: os.environ[key] for key in ("STORAGE_EMULATOR_HOST",) if key in os.environ}
    return {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3", **passed}


def connect(address: str | None) -> None:
    """Join Ray: `None` joins the job's cluster when run by `ray job submit`, else starts a
    local Ray; `auto` joins the cluster that RAY_ADDRESS or this machine names; else the address."""
    if ray.is_initialized():
        return
    try:
        ray.init(address=address, runtime_env={"env_vars": job_env()}, logging_level="WARNING")
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise UsageError(f"cannot connect to Ray at {address}: {' '.join(str(err).split())}") from None


def placeable_workers(cpus_per_worker: int) -> int:
    """How many workers of `cpus_per_worker` CPUs the live nodes can hold at once."""
    return sum(
        int(node["Resources"].get("CPU", 0) // cpus_per_worker) for node in ray.nodes() if node["Alive"]
    )


def require_capacity(count: int, cpus_each: int, what: str, remedy: str) -> None:
    """Fail at once, rather than wait forever, when the cluster cannot place `count` processes
    of `cpus_each` CPUs (`what` names them in the message, `remedy` says what to change)."""
    fits = placeable_workers(cpus_each)
    if fits < count:
        total = int(ray.cluster_resources().get("CPU", 0))
        raise UsageError(
            f"the Ray cluster ({total} CPUs) can place {fits} process(es) of {cpus_each} CPU(s), "
            f"not {count} {what}: {remedy}, or add nodes"
        )


def worker_env(cpus: int) -> dict:
    """Runtime env vars for a TensorFlow process given `cpus` CPUs: thread pools sized to them.
    (Importing TFQ starts TensorFlow, so the pools are sized by env var, not tf.config.)"""
    return {**job_env(), "TF_NUM_INTRAOP_THREADS": str(cpus), "TF_NUM_INTEROP_THREADS": str(cpus)}
