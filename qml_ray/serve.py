"""`python -m qml_ray.serve` and `qml_ray.serve(run)`: online inference with a run's weights on Ray Serve.

The application (serving.py) is an HTTP endpoint and the replicas that hold the run's model, built
with the run's own model function and parameters; `app` builds it, for the command, for
`qml_ray.serve` and for a RayService on GKE (`cluster render --serve`), whose Serve config names
`qml_ray.serve:app` with the run as its argument. The command checks the run before Ray starts,
prints one line with the URL, and serves until Ctrl-C or SIGTERM, then deletes its application
(and stops Serve when no other application runs). `qml_ray.serve(run)` returns a `Served` whose
`predict(rows)` answers as POST /predict does.
"""

import logging
import socket
import sys
import threading
import types

import numpy as np

from qml_ray import cli, config as config_lib, contract, interrupts, runtime, serving, storage
from qml_ray.errors import EnvironmentProblem, UsageError

APPLICATION = "qml_ray"
HOST = "127.0.0.1"
PORT = 8000
SERVE_KEYS = ("serve_batch_size", "serve_batch_wait", "serve_max_body_mb")  # the config keys the command takes


def parse_args(argv=None):
    parser = cli.ArgumentParser(
        prog="python -m qml_ray.serve",
        description="Serve a trained run's model over HTTP with Ray Serve (POST /predict, GET /healthz, GET /) "
        "until Ctrl-C.",
    )
    parser.add_argument("--run", required=True, help="the run folder, local or gs://, e.g. runs/20260101-120000")
    parser.add_argument("--port", type=int, default=PORT, help=f"the HTTP port, on {HOST} (default: {PORT})")
    parser.add_argument(
        "--replicas",
        default="1",
        metavar="N|MIN-MAX",
        help="model replicas: N, or MIN-MAX to scale with the requests waiting (default: 1)",
    )
    keys = parser.add_argument_group("config keys", "over the run's config")
    for key in SERVE_KEYS:
        keys.add_argument(cli.flag(key), dest=key, metavar="N", help=f"{config_lib.doc(key)} [default: the run's]")
    cli.add_address_flag(parser)
    cli.add_verbose_flag(parser)
    args = parser.parse_args(argv)
    if not 1 <= args.port <= 65535:
        parser.error(f"--port must be 1..65535, got {args.port}")
    return args


def replica_range(replicas: str | int, flag: str = "--replicas") -> tuple[int, int]:
    """Replicas given as N or MIN-MAX (by `flag`) as (fewest, most), or a UsageError."""
    least, dash, most = str(replicas).partition("-")
    if not (least.strip().isdigit() and (not dash or most.strip().isdigit())):
        raise UsageError(f"{flag} must be a whole number or MIN-MAX (1-4), got {replicas!r}")
    fewest, most = int(least), int(most if dash else least)
    if not 1 <= fewest <= most:
        raise UsageError(f"{flag} must be at least 1, and MIN at most MAX, got {replicas!r}")
    return fewest, most


def app(args: dict):
    """The Serve application (an application builder, as a Serve config's `import_path` names it):
    args `run` (the run folder), optional `replicas` (N or MIN-MAX) and the config's serve keys over the run's."""
    run = storage.absolute(args["run"])
    config = config_lib.of_run(run)
    config = config.replace(**{key: args[key] for key in SERVE_KEYS if key in args})
    fewest, most = replica_range(args.get("replicas", 1))
    model_function = contract.recorded(run) or contract.resolve(config.model)
    scaling = (
        {"num_replicas": most}
        if fewest == most
        else {"autoscaling_config": {"min_replicas": fewest, "max_replicas": most, "target_ongoing_requests": 2}}
    )
    replica = serving.ModelReplica.options(
        **scaling,
        max_ongoing_requests=2 * config.serve_batch_size,  # a batch waits to fill while the one before runs
        ray_actor_options={
            "num_cpus": config.cpus_per_worker,
            "runtime_env": {"env_vars": runtime.worker_env(config.cpus_per_worker, config.size_thread_pools)},
        },
    ).bind(run, contract.pickled(model_function), config.serve_batch_size, config.serve_batch_wait)
    max_body = int(config.serve_max_body_mb * 2**20)
    return serving.Endpoint.options(max_ongoing_requests=1000).bind(replica, max_body)


class Served:
    """A served run: its `url`, `predict(rows)` as POST /predict answers, `stop()`."""

    def __init__(self, handle, url: str):
        self.handle, self.url = handle, url

    def predict(self, rows: list[dict]) -> np.ndarray:
        """The predictions for `rows` (dicts of a value per input: a circuit as its serialized bytes or their
        base64), one row of values per row; a UsageError for a row the model cannot take."""
        answer = self.handle.answer.remote({"rows": rows}).result()
        if "error" in answer:
            raise UsageError(answer["error"])
        return np.array(answer["predictions"], np.float32)

    def stop(self) -> None:
        stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def serve(
    run: str,
    *,
    replicas: str | int = 1,
    port: int = PORT,
    address: str | None = None,
    verbose: bool = False,
    **keys,
) -> Served:
    """Serve run `run`'s model as the command does (the config's serve keys as keyword arguments) and
    return a `Served`; on the Ray this process has joined, else as `address` says. Bad input raises
    UsageError before anything starts."""
    from ray import serve as ray_serve

    storage.check_location(run)
    run = storage.absolute(run)
    unknown = sorted(set(keys) - set(SERVE_KEYS))
    if unknown:
        raise UsageError(f"qml_ray.serve takes no {unknown[0]!r} (its config keys: {', '.join(SERVE_KEYS)})")
    fewest, _ = replica_range(replicas)
    config = config_lib.of_run(run).replace(**keys)
    with cli.native_stderr_hidden(not verbose):
        model = checked_model(run)
        require_free_port(port)
        join_cluster(config, address, verbose, fewest, model)
        require_no_served_run()
        if not verbose:
            logging.getLogger("ray.serve").setLevel(logging.WARNING)  # Serve's lines of each step, on the console
        ray_serve.start(http_options={"host": HOST, "port": port})
        application = app({"run": run, "replicas": replicas, **keys})
        try:
            handle = interrupts.waited(ray_serve.run, application, name=APPLICATION, route_prefix="/")
        except RuntimeError:  # Serve's word that the replicas failed to start
            failure = replica_failure()
            stop()
            raise EnvironmentProblem(f"the model's replicas failed to start: {failure}") from None
    return Served(handle, f"http://{HOST}:{port}")


def require_no_served_run() -> None:
    """A UsageError when this Ray serves a run already (one served run per Ray: one HTTP port, one route)."""
    from ray import serve as ray_serve
    from ray.serve.exceptions import RayServeException

    try:
        applications = ray_serve.status().applications
    except RayServeException:  # Serve does not run
        return
    if APPLICATION in applications:
        raise UsageError("this Ray serves a run already: stop it first (one served run per Ray)")


def replica_failure() -> str:
    """The last line of what the application's failed deployment says (its error's, after the traceback)."""
    from ray import serve as ray_serve

    deployments = ray_serve.status().applications[APPLICATION].deployments.values()
    messages = [line for status in deployments for line in status.message.splitlines() if line.strip()]
    return messages[-1] if messages else "see the replicas' logs (Ray's serve logs)"


def checked_model(run: str):
    """The run's model with its weights, built here so that a bad run fails in one line before Ray starts."""
    from qml_ray import infer

    return infer.load_trained_model(run)


def require_free_port(port: int) -> None:
    with socket.socket() as sock:
        try:
            sock.bind((HOST, port))
        except OSError as err:
            raise UsageError(f"cannot serve on {HOST}:{port}: {err.strerror}; choose another --port") from None


def join_cluster(config: config_lib.Config, address: str | None, verbose: bool, replicas: int, model) -> None:
    """Join Ray, and make sure it can place the fewest replicas and hold their state vectors."""
    from qml_ray import quantum_layers

    runtime.connect(address, log_to_driver=verbose)
    runtime.require_capacity(
        replicas, config.cpus_per_worker, "model replica(s)", "lower --replicas", config.capacity_timeout
    )
    runtime.require_state_memory(
        len(quantum_layers.qubits(model)),
        config.cpus_per_worker,
        "a model replica",
        "serve on a cluster with more memory per node",
    )


def stop() -> None:
    """Delete the application, and stop Serve when no other application runs."""
    from ray import serve as ray_serve

    ray_serve.delete(APPLICATION)
    if not ray_serve.status().applications:
        ray_serve.shutdown()


def main(argv=None) -> None:
    args = parse_args(argv)
    keys = {key: getattr(args, key) for key in SERVE_KEYS if getattr(args, key) is not None}
    interrupts.say_on_interrupt(f"stopped serving {args.run}")
    served = serve(args.run, replicas=args.replicas, port=args.port, address=args.address, verbose=args.verbose, **keys)
    interrupts.on_interrupt(stop)
    print(f"serving {args.run} at {served.url} (POST {serving.PREDICT}); Ctrl-C stops", flush=True)
    threading.Event().wait()


class _CallableModule(types.ModuleType):
    """This module, callable: `qml_ray.serve(run)` is `qml_ray.serve.serve(run)`."""

    def __call__(self, run: str, **options) -> Served:
        return serve(run, **options)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    cli.run(main)
