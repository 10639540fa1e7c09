"""The run configuration: one YAML file drives the laptop run and the cluster."""

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import yaml

from qml_ray import storage
from qml_ray.errors import UsageError


@dataclass(frozen=True)
class Config:
    """Everything that defines a training run. Field comments are the docs."""

    qubits: int = 8  # cluster-state qubits (>= 4; odd counts allowed)
    layers: int = 1  # quantum conv + pool layers
    examples: int = 160  # excitation examples, train and test together
    test_fraction: float = 0.3  # share of the examples held out for test
    seed: int = 0  # seeds the data set and the weight initialisation
    epochs: int = 50
    batch_size: int = 32  # per worker; the global batch is batch_size x workers
    learning_rate: float = 0.02  # Adam
    differentiator: str = "auto"  # quantum gradient: block (qml_ray's block-fused adjoint), tfq (TFQ's Adjoint), auto
    # (block from 14 qubits, where it is the faster: BENCHMARKS.md)
    workers: int = 1  # Ray Train workers, one MultiWorkerMirroredStrategy replica each
    cpus_per_worker: int = 1  # Ray CPUs per worker; also sizes its TF thread pools
    checkpoint_every: int = 5  # epochs between checkpoints (the last epoch always is one)
    max_failures: int = 3  # times Ray Train restarts the workers from the last checkpoint
    capacity_timeout: int = 0  # seconds to wait for the cluster to grow to the workers (autoscaling)
    storage: str = "runs"  # folder that holds the run folders
    size_thread_pools: bool = True  # size each worker's TF intra-/inter-op pools to its CPUs (else TF's defaults)
    profile_steps: str = ""  # "START,STOP" (or "STEP"): trace these training steps into rank 0's TensorBoard logs
    profiler_port: int = 0  # on-demand TF profiler server on each worker at this port + its local rank; 0 = off

    def validate(self) -> "Config":
        """Return self, or raise UsageError naming the first bad value."""
        _require(self.qubits >= 4, "qubits must be at least 4")
        most = max_layers(self.qubits)
        _require(1 <= self.layers <= most, f"layers must be 1..{most} for {self.qubits} qubits")
        _require(0 < self.test_fraction < 1, "test_fraction must be between 0 and 1")
        _require(self.examples >= 10, "examples must be at least 10")
        for name in ("epochs", "batch_size", "workers", "cpus_per_worker", "checkpoint_every"):
            _require(getattr(self, name) >= 1, f"{name} must be at least 1")
        _require(self.max_failures >= 0, "max_failures must be 0 or more")
        _require(self.capacity_timeout >= 0, "capacity_timeout must be 0 or more")
        _require(self.learning_rate > 0, "learning_rate must be positive")
        _require(self.differentiator in DIFFERENTIATORS,
                 f"differentiator must be one of {', '.join(DIFFERENTIATORS)}, got {self.differentiator!r}")
        _require(bool(self.storage), "storage must not be empty")
        self.profile_range()
        top = 65535 - self.workers  # room for port + local rank
        _require(self.profiler_port == 0 or 1024 <= self.profiler_port <= top,
                 f"profiler_port must be 0 (off) or 1024..{top}")
        storage.check_location(self.storage)
        return self

    def profile_range(self) -> tuple[int, int] | None:
        """The first and last training step to trace (counted from 1), or None when off."""
        if not self.profile_steps:
            return None
        try:
            steps = [int(step) for step in self.profile_steps.split(",")]
        except ValueError:
            steps = []
        _require(len(steps) in (1, 2) and 1 <= steps[0] <= steps[-1],
                 f"profile_steps must be START,STOP (1 <= START <= STOP) or one step, got {self.profile_steps!r}")
        return steps[0], steps[-1]

    def replace(self, **changes) -> "Config":
        return dataclasses.replace(self, **changes).validate()

    def to_yaml(self) -> str:
        return yaml.safe_dump(asdict(self), sort_keys=False)


def asdict(config: Config) -> dict:
    return dataclasses.asdict(config)


DIFFERENTIATORS = ("auto", "block", "tfq")
FIELDS = {f.name: f for f in dataclasses.fields(Config)}


def max_layers(qubits: int) -> int:
    """Conv + pool layers that fit: each pooling keeps ceil(n/2) qubits, a conv needs 2."""
    layers = 0
    while qubits >= 2:
        qubits = (qubits + 1) // 2
        layers += 1
    return layers


def from_mapping(values: dict) -> Config:
    """Build a validated Config from a mapping, rejecting unknown keys and wrong types."""
    unknown = sorted(set(values) - set(FIELDS))
    _require(not unknown, f"unknown config key(s): {', '.join(unknown)}")
    return Config(**{k: _coerce(k, v) for k, v in values.items()}).validate()


def load(path: str | Path) -> Config:
    """Read a config YAML file."""
    path = Path(path)
    try:
        values = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"config file not found: {path}") from None
    except (OSError, yaml.YAMLError) as err:
        raise UsageError(f"cannot read config file {path}: {err}") from None
    if values is None:
        values = {}
    _require(isinstance(values, dict), f"config file {path} must hold a mapping of keys to values")
    return from_mapping(values)


def of_run(run: str) -> Config:
    """The resolved config stored in a run folder."""
    path = storage.join(run, storage.CONFIG)
    _require(storage.exists(path), f"no run at {run} (it has no config.yaml)")
    try:
        values = yaml.safe_load(storage.read_text(path))
    except yaml.YAMLError as err:
        raise UsageError(f"cannot read {path}: {err}") from None
    _require(isinstance(values, dict), f"{path} must hold a mapping of keys to values")
    return from_mapping(values)


def _coerce(key: str, value):
    kind = FIELDS[key].type
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is str and isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # YAML reads `profile_steps: 5` as a number
    if isinstance(value, str) and kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    _require(ok, f"{key} must be {_KIND_NAMES[kind]}, got {value!r}")
    return value


_KIND_NAMES = {int: "a whole number", float: "a number", str: "a string", bool: "true or false"}


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise UsageError(message)
