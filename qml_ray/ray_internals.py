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

Private modules change without notice: RAY_VERSION is the Ray these were checked against, and a
test fails as soon as the installed Ray is another, so that they are checked again.
"""

from ray._private.state import state
from ray.core.generated.gcs_pb2 import PlacementGroupTableData
from ray.train.v2._internal.exceptions import WorkerGroupStartupTimeoutError
from ray.train.v2._internal.util import TrainingFramework

RAY_VERSION = "2.60.0"

__all__ = ["RAY_VERSION", "TrainingFramework", "WorkerGroupStartupTimeoutError", "placement_group_creators"]


def placement_group_creators() -> dict[str, str]:
    """The actor ID (hex) that asked for each placement group (ID hex) an actor asked for, on the
    cluster this process has joined (ray.init)."""
    groups = map(PlacementGroupTableData.FromString, state._connect_and_get_accessor().get_placement_group_table())
    return {group.placement_group_id.hex(): group.creator_actor_id.hex() for group in groups if group.creator_actor_id}
