"""What qml_ray takes from Ray's private modules, kept in this one module, and why.

Ray 2.60 offers no public API for any of these:

- `TrainingFramework` (ray.train.v2._internal.util): the `framework` a Ray Train BackendConfig
  names, which the dashboard's Train view shows with its version. Ray's own TensorflowConfig
  returns TENSORFLOW; tf_backend.TFConfig stands in for that config, so it must too.
- `WorkerGroupStartupTimeoutError` (ray.train.v2._internal.exceptions): the controller failure
  raised when the cluster cannot place a worker group in time, which `train` words as "the
  cluster could not place all N workers".
- `placement_group_creators`: which actor asked for each placement group, from Ray's GCS table
  (ray._private.state). The state API lists a group's job, not its actor; runtime.py keeps a group
  of an ended job whose creator is alive (a detached actor's), and releases the rest.
- `token_authentication` and `gcs_refuses`: whether this process uses Ray's token authentication,
  and with which token (ray._raylet), and whether a cluster's GCS refuses a call with a given token,
  by one call of its own gRPC API (ray.core.generated). Joining a cluster whose authentication
  differs, Ray either retries for 20 s or joins and then loses every actor it starts; runtime.py
  asks first, and says in one line what to set.
- `size_elastic_groups_on_the_live_nodes`: Ray Train's elastic policy (ray.train.v2._internal.
  execution.scaling_policy) sizes a worker group by what Ray Data's AutoscalingCoordinator reserves it.
  That view of the nodes is refreshed every 20 s, so just after a node is lost it still counts the
  node's CPUs: the restart asks for a worker that cannot be placed and waits for it, the very wait
  elastic training is for. And the coordinator shares the nodes among every request it holds, a
  stopped job's too until it expires (minutes): a run then starts on fewer workers than fit and does
  not grow. The policy now sizes groups on the live nodes' resources, as the GCS lists them; a
  restart's decision waits until the GCS has declared a lost node dead (its health checks,
  ray._config); and fewer workers than the least fitting for as long as Ray Train waits to place a
  group ends the wait as a placement that timed out does, where the policy would wait without end.
- `no_dataset_manager_without_datasets`: Ray Train starts a DatasetManager actor for every run, a
  process of its own (1.4 s of CPU here), even when it is given no Ray Dataset. A run whose data
  each worker holds in memory gets none now, and its workers no shard provider, which they never ask.
- `keep_cluster_errors_off_the_console`: a driver prints the cluster's error messages (a node marked
  dead, a lost raylet's last 20 log lines) through ray._private.worker.print_to_stdstream, whatever
  log_to_driver says. The command says what a lost node means in one line of its own.

Private modules change without notice: RAY_VERSION is the Ray these were checked against, and a
test fails as soon as the installed Ray is another, so that they are checked again.
"""

import os
import time

import grpc
import ray
from ray._private import worker as ray_worker
from ray._private.state import state
from ray._raylet import AuthenticationMode, AuthenticationTokenLoader, get_authentication_mode
from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
from ray.core.generated.gcs_pb2 import PlacementGroupTableData
from ray.exceptions import AuthenticationError
from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
from ray.train.v2._internal.constants import DEFAULT_WORKER_GROUP_START_TIMEOUT_S, WORKER_GROUP_START_TIMEOUT_S_ENV_VAR
from ray.train.v2._internal.exceptions import WorkerGroupStartupTimeoutError
from ray.train.v2._internal.execution.scaling_policy import ElasticScalingPolicy, NoopDecision
from ray.train.v2._internal.util import TrainingFramework

RAY_VERSION = "2.60.0"

__all__ = [
    "RAY_VERSION",
    "TrainingFramework",
    "WorkerGroupStartupTimeoutError",
    "gcs_refuses",
    "keep_cluster_errors_off_the_console",
    "no_dataset_manager_without_datasets",
    "placement_group_creators",
    "size_elastic_groups_on_the_live_nodes",
    "token_authentication",
]


def placement_group_creators() -> dict[str, str]:
    """The actor ID (hex) that asked for each placement group (ID hex) an actor asked for, on the
    cluster this process has joined (ray.init)."""
    groups = map(PlacementGroupTableData.FromString, state._connect_and_get_accessor().get_placement_group_table())
    return {group.placement_group_id.hex(): group.creator_actor_id.hex() for group in groups if group.creator_actor_id}


def token_authentication() -> tuple[bool, str | None]:
    """Whether this process joins Ray with token authentication (RAY_AUTH_MODE=token), and then the token
    it gives (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token), None if it has none. Without
    token authentication no token is loaded: a token Ray has loaded, its own servers in this process
    require of every caller."""
    if get_authentication_mode() != AuthenticationMode.TOKEN:
        return False, None
    loader = AuthenticationTokenLoader.instance()
    try:
        return True, loader.get_raw_token() if loader.has_token() else None
    except AuthenticationError:  # no token where Ray looks (a RAY_AUTH_TOKEN_PATH that cannot be read, say)
        return True, None


def gcs_refuses(address: str, token: str | None, timeout: float) -> bool | None:
    """Whether the GCS at `address` (host:port) refuses a call that gives `token` (None: no token) as
    unauthenticated; None when it does not answer as a GCS (nothing there, TLS, another server)."""
    metadata = [("authorization", f"Bearer {token}")] if token else []
    with grpc.insecure_channel(address) as channel:
        try:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(), metadata=metadata, timeout=timeout
            )
        except grpc.RpcError as err:
            return True if err.code() == grpc.StatusCode.UNAUTHENTICATED else None
    return False


def size_elastic_groups_on_the_live_nodes() -> None:
    """In this process (Ray Train's controller), have the elastic policy size worker groups on the live
    nodes' resources, a restarted one once the GCS has had time to declare a lost node dead; fewer than
    its least workers fitting for longer than a group's placement is waited for is a placement timed out."""
    if getattr(ElasticScalingPolicy, "on_the_live_nodes", False):
        return
    decide_running = ElasticScalingPolicy.make_decision_for_running_worker_group
    decide_stopped = ElasticScalingPolicy.make_decision_for_non_running_worker_group

    def while_running(policy: ElasticScalingPolicy, *args, **kwargs):
        policy.stopped_at = None  # the next decision for a stopped group is a restart's
        return decide_running(policy, *args, **kwargs)

    def when_stopped(policy: ElasticScalingPolicy):
        if _awaiting_node_death(policy):
            return NoopDecision()  # asked again at the controller's next step
        decision = decide_stopped(policy)
        _bound_the_wait(policy, isinstance(decision, NoopDecision))
        return decision

    ElasticScalingPolicy.make_decision_for_running_worker_group = while_running
    ElasticScalingPolicy.make_decision_for_non_running_worker_group = when_stopped
    ElasticScalingPolicy._get_reserved_resources = _live_node_resources
    ElasticScalingPolicy.on_the_live_nodes = True


def no_dataset_manager_without_datasets() -> None:
    """In this process (Ray Train's controller), start no DatasetManager for a run given no datasets."""
    if getattr(DatasetsCallback, "only_with_datasets", False):
        return
    provide = DatasetsCallback.before_init_train_context

    def only_with_datasets(callback: DatasetsCallback, workers: list) -> dict:
        return provide(callback, workers) if callback._datasets else {}

    DatasetsCallback.before_init_train_context = only_with_datasets
    DatasetsCallback.only_with_datasets = True


def _live_node_resources(policy: ElasticScalingPolicy) -> dict:
    """Every live node's resources by node ID: what the coordinator would reserve the policy alone."""
    return {node["NodeID"]: node["Resources"] for node in ray.nodes() if node["Alive"]}


def _awaiting_node_death(policy: ElasticScalingPolicy) -> bool:
    """Whether a restart's decision still waits for the GCS to declare a lost node dead."""
    if not hasattr(policy, "stopped_at"):  # the first start
        return False
    policy.stopped_at = policy.stopped_at or time.monotonic()
    return time.monotonic() - policy.stopped_at < _node_death_seconds()


def _bound_the_wait(policy: ElasticScalingPolicy, short: bool) -> None:
    """Raise WorkerGroupStartupTimeoutError once fewer than the least workers have fitted (`short`) for as
    long as Ray Train waits to place a group."""
    policy.short_since = (getattr(policy, "short_since", None) or time.monotonic()) if short else None
    if policy.short_since and time.monotonic() - policy.short_since > _placement_wait_seconds():
        policy.short_since = None
        raise WorkerGroupStartupTimeoutError(policy.scaling_config.min_workers)


def _placement_wait_seconds() -> float:
    """How long Ray Train waits for a worker group to be placed (train.set_ray_train_env sets it)."""
    return float(os.environ.get(WORKER_GROUP_START_TIMEOUT_S_ENV_VAR, DEFAULT_WORKER_GROUP_START_TIMEOUT_S))


def _node_death_seconds() -> float:
    """How long the GCS takes to declare a node that stopped answering dead: its failed health checks."""
    return ray._config.health_check_period_ms() * ray._config.health_check_failure_threshold() / 1000


def keep_cluster_errors_off_the_console() -> None:
    """Have this driver leave the cluster's error messages to Ray's log files (--verbose shows them)."""
    printing = ray_worker.print_to_stdstream
    if getattr(printing, "quiet", False):
        return

    def print_but_cluster_errors(data: dict, ignore_prefix: bool) -> None:
        if data.get("pid") != "raylet":  # the error listener's: the workers' logs reach here only if verbose
            printing(data, ignore_prefix)

    print_but_cluster_errors.quiet = True
    ray_worker.print_to_stdstream = print_but_cluster_errors
