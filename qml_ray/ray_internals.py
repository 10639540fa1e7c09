"""What qml_ray takes from Ray's private modules, kept in this one module, and why.

Ray 2.60 offers no public API for either:

- `TrainingFramework` (ray.train.v2._internal.util): the `framework` a Ray Train BackendConfig
  names, which the dashboard's Train view shows with its version. Ray's own TensorflowConfig
  returns TENSORFLOW; tf_backend.TFConfig stands in for that config, so it must too.
- `WorkerGroupStartupTimeoutError` (ray.train.v2._internal.exceptions): the controller failure
  raised when the cluster cannot place a worker group in time, which `train` words as "the
  cluster could not place all N workers".

Private modules change without notice: RAY_VERSION is the Ray these were checked against, and a
test fails as soon as the installed Ray is another, so that they are checked again.
"""

from ray.train.v2._internal.exceptions import WorkerGroupStartupTimeoutError
from ray.train.v2._internal.util import TrainingFramework

RAY_VERSION = "2.60.0"

__all__ = ["RAY_VERSION", "TrainingFramework", "WorkerGroupStartupTimeoutError"]
