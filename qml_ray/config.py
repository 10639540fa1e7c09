"""The run configuration: one YAML file drives the laptop run and the cluster."""

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from qml_ray import safe_yaml, storage
from qml_ray.errors import UsageError

# The simulators hold every circuit's whole state vector in one process: 2**qubits complex64
# amplitudes, STATES_PER_CIRCUIT of them at once (TFQ's adjoint gradient keeps 3, the block
# method 2). Beyond 38 qubits that is more than the largest machines have (about 12 TB).
MAX_QUBITS = 38
DEFAULT_MODEL = "qml_ray.model:qcnn"
STATES_PER_CIRCUIT = 3
AMPLITUDE_BYTES = 8


def _key(default, meaning: str):
    """A config key: its built-in default and what it means (also the help of its command-line flag)."""
    return dataclasses.field(default=default, metadata={"doc": meaning})


@dataclass(frozen=True)
class Config:
    """Everything that defines a training run: one YAML file, every key a command-line flag too."""

    model: str = _key(
        DEFAULT_MODEL,
        "MODULE:FUNCTION returning the compiled tf.keras model to train (its parameters: params, and the "
        "config keys it names); the default is the built-in QCNN",
    )
    params: dict = dataclasses.field(
        default_factory=dict,
        metadata={"doc": "the model function's parameters, a mapping (flag: --param KEY=VALUE, repeatable)"},
    )
    data: str = _key(
        "",
        "Parquet file or folder (local or gs://) with a binary `circuit` column and a `label` column; "
        "empty: the QCNN's generated excitation data set",
    )
    validation_data: str = _key(
        "", "Parquet file or folder to validate on; empty: test_fraction of the rows of `data`, split by seed"
    )
    qubits: int = _key(8, f"qubits of the cluster state the circuits run on (4..{MAX_QUBITS}; odd counts too)")
    layers: int = _key(1, "quantum convolution + pooling layers, from 1 to what the qubits allow (3 for 8 qubits)")
    examples: int = _key(160, "excitation circuits in the data set, training and test together (at least 10)")
    test_fraction: float = _key(0.3, "share of the examples held out for testing (validation), between 0 and 1")
    seed: int = _key(0, "seeds the data set, the weight initialisation and the shuffling")
    epochs: int = _key(50, "passes over the training examples")
    batch_size: int = _key(32, "examples per step on each worker; the global batch is batch_size x workers")
    learning_rate: float = _key(0.02, "Adam's learning rate")
    hidden_activation: str = _key(
        "linear",
        "activation of the Dense(8) layer between the quantum readouts and "
        "the output: linear (the tutorial's model) or relu",
    )
    differentiator: str = _key(
        "auto",
        "quantum gradient: block (qml_ray's block-fused adjoint), tfq (TFQ's "
        "Adjoint), or auto: block from 14 qubits, tfq below",
    )
    workers: int = _key(1, "Ray Train workers, one MultiWorkerMirroredStrategy replica each")
    cpus_per_worker: int = _key(1, "Ray CPUs per worker; also sizes its TensorFlow thread pools")
    checkpoint_every: int = _key(5, "epochs between checkpoints (the last epoch always is one)")
    max_failures: int = _key(3, "times Ray Train restarts the workers from the last checkpoint after a failure")
    capacity_timeout: int = _key(
        0, "seconds to wait for the cluster to grow to the workers (autoscaling); 0 fails at once"
    )
    storage: str = _key("runs", "where the run folders live: a local folder or gs://BUCKET/PREFIX")
    size_thread_pools: bool = _key(
        True,
        "size each worker's TensorFlow thread pools to its CPUs "
        "(false: TensorFlow's defaults, every core of the machine)",
    )
    profile_steps: str = _key(
        "",
        "START,STOP (or one STEP): trace these training steps, counted from 1, "
        "into rank 0's TensorBoard logs; empty: off",
    )
    profiler_port: int = _key(
        0, "on-demand TensorFlow profiler server on each worker at this port + its local rank; 0: off"
    )

    def validate(self) -> "Config":
        """Return self, or raise UsageError naming the first bad value."""
        _require(self.qubits >= 4, "qubits must be at least 4")
        _require(self.qubits <= MAX_QUBITS, f"qubits must be at most {MAX_QUBITS}: no machine holds the state vectors")
        most = max_layers(self.qubits)
        _require(1 <= self.layers <= most, f"layers must be 1..{most} for {self.qubits} qubits")
        _require(0 < self.test_fraction < 1, "test_fraction must be between 0 and 1")
        _require(self.examples >= 10, "examples must be at least 10")
        _require(self.seed >= 0, "seed must be 0 or more")
        for name in ("epochs", "batch_size", "workers", "cpus_per_worker", "checkpoint_every"):
            _require(getattr(self, name) >= 1, f"{name} must be at least 1")
        _require(self.max_failures >= 0, "max_failures must be 0 or more")
        _require(self.capacity_timeout >= 0, "capacity_timeout must be 0 or more")
        _require(0 < self.learning_rate < math.inf, "learning_rate must be a positive number")
        for key, allowed in CHOICES.items():
            value = getattr(self, key)
            _require(value in allowed, f"{key} must be one of {', '.join(allowed)}, got {value!r}")
        _require(bool(self.storage), "storage must not be empty")
        self.profile_range()
        top = 65535 - self.workers  # room for port + local rank
        _require(
            self.profiler_port == 0 or 1024 <= self.profiler_port <= top,
            f"profiler_port must be 0 (off) or 1024..{top}",
        )
        from qml_ray.contract import parse

        parse(self.model)
        for location in (self.storage, self.data, self.validation_data):
            if location:
                storage.check_location(location)
        _require(not self.validation_data or self.data, "validation_data needs data (the training data) too")
        _require(all(isinstance(key, str) for key in self.params), "params must map names to values")
        return self

    def profile_range(self) -> tuple[int, int] | None:
        """The first and last training step to trace (counted from 1), or None when off."""
        if not self.profile_steps:
            return None
        try:
            steps = [int(step) for step in self.profile_steps.split(",")]
        except ValueError:
            steps = []
        _require(
            len(steps) in (1, 2) and 1 <= steps[0] <= steps[-1],
            f"profile_steps must be START,STOP (1 <= START <= STOP) or one step, got {self.profile_steps!r}",
        )
        return steps[0], steps[-1]

    def replace(self, **changes) -> "Config":
        return dataclasses.replace(self, **changes).validate()

    def to_yaml(self) -> str:
        return yaml.safe_dump(asdict(self), sort_keys=False)


def asdict(config: Config) -> dict:
    return dataclasses.asdict(config)


FIELDS = {f.name: f for f in dataclasses.fields(Config)}
CHOICES = {"differentiator": ("auto", "block", "tfq"), "hidden_activation": ("linear", "relu")}


def doc(key: str) -> str:
    """What a config key means."""
    return FIELDS[key].metadata["doc"]


def state_bytes(qubits: int, threads: int) -> int:
    """Memory the state vectors of a process simulating on `threads` threads (a circuit each) take."""
    return threads * STATES_PER_CIRCUIT * AMPLITUDE_BYTES * 2**qubits


def split_sizes(config: Config) -> tuple[int, int]:
    """The number of training and of test examples."""
    n_test = max(1, round(config.examples * config.test_fraction))
    return config.examples - n_test, n_test


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
        values = safe_yaml.read(path, f"config file {path}")
    except FileNotFoundError:
        raise UsageError(f"config file not found: {path}") from None
    except (OSError, UnicodeError) as err:
        raise UsageError(f"cannot read config file {path}: {err}") from None
    if values is None:
        values = {}
    _require(isinstance(values, dict), f"config file {path} must hold a mapping of keys to values")
    return from_mapping(values)


def of_run(run: str) -> Config:
    """The resolved config stored in a run folder."""
    path = storage.join(run, storage.CONFIG)
    _require(storage.exists(path), f"no run at {run} (it has no config.yaml)")
    values = safe_yaml.load(storage.read_text(path), path)
    _require(isinstance(values, dict), f"{path} must hold a mapping of keys to values")
    return from_mapping(values)


def _coerce(key: str, value):
    """`value` as the key's type, or a UsageError. Flags give text ("4", "0.1", "false"), and YAML
    reads `profile_steps: 5` as a number."""
    kind = FIELDS[key].type
    if isinstance(value, str) and kind is not str:
        value = _from_text(value, kind)
    elif isinstance(value, int) and not isinstance(value, bool) and kind in (float, str):
        value = kind(value)
    elif value is None and kind is dict:  # `params:` left empty in a file
        value = {}
    _require(
        isinstance(value, kind) and isinstance(value, bool) == (kind is bool),
        f"{key} must be {_KIND_NAMES[kind]}, got {value!r}",
    )
    return value


def _from_text(text: str, kind: type):
    """A flag's text as a `kind`, or the text itself when it is none."""
    if kind is bool:
        return {"true": True, "false": False}.get(text.lower(), text)
    try:
        return kind(text)
    except ValueError:
        return text


_KIND_NAMES = {int: "a whole number", float: "a number", str: "a string", bool: "true or false", dict: "a mapping"}


def yaml_scalar(text: str, where: str):
    """`text` as YAML reads a value (0.1, 2, true, relu), or a UsageError naming `where`."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise UsageError(f"{where}: cannot read the value: {err}") from None


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise UsageError(message)
