"""The run configuration: one YAML file drives the laptop run and the cluster.

pydantic validates it (types, bounds, choices, unknown keys); every failure becomes one
UsageError line naming the key. The QCNN's bound on `layers` (`max_layers`) stays here, not in
model.py: `qubits` and `layers` are the default model's keys, checked with the others in the driver
before anything is written, and model.py imports TensorFlow. The simulator's memory is memory.py's.
"""

import re
import reprlib
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
import yaml
from pydantic import BeforeValidator, ConfigDict, Field

from qml_ray import choices, safe_yaml, storage
from qml_ray.errors import UsageError

# The simulators hold every circuit's whole state vector in one process: 2**qubits complex64
# amplitudes, memory.STATES_PER_CIRCUIT of them at once. Beyond 38 qubits that is more than the
# largest machines have (about 12 TB).
MAX_QUBITS = 38
DEFAULT_MODEL = "qml_ray.model:qcnn"
MODEL_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")  # MODULE:FUNCTION
REPLACEMENT_WAIT_SECONDS = 60  # Ray Train's own wait for lost workers' replacements (capacity_timeout 0)


def _not_a_bool(value):
    """YAML's true and false as text, which no number parses (pydantic would read them as 1 and 0)."""
    return str(value).lower() if isinstance(value, bool) else value


Whole = Annotated[int, BeforeValidator(_not_a_bool)]
Number = Annotated[float, BeforeValidator(_not_a_bool)]


def _key(default, meaning: str, **bounds):
    """A config key: its built-in default, what it means (also the help of its command-line flag)
    and the bounds of its value."""
    return Field(default, description=meaning, **bounds)


class Config(pydantic.BaseModel):
    """Everything that defines a training run: one YAML file, every key a command-line flag too."""

    # Frozen; unknown keys refused; a number where text is meant (`profile_steps: 5`) read as text.
    model_config = ConfigDict(frozen=True, extra="forbid", coerce_numbers_to_str=True, protected_namespaces=())

    model: str = _key(
        DEFAULT_MODEL,
        "MODULE:FUNCTION returning the compiled tf.keras model to train (its parameters: params, and the "
        "config keys it names); the default is the built-in QCNN",
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="the model function's parameters, a mapping (flag: --param KEY=VALUE, repeatable)",
    )
    callbacks: str = _key(
        "",
        "MODULE:FUNCTION returning a list of Keras callbacks of your own, called on every worker as "
        "FUNCTION(rank=RANK, run=RUN_FOLDER); they run after qml_ray's own; empty: none",
    )
    data: str = _key(
        "",
        "Parquet file or folder (local or gs://) with a `label` column and the columns the model's inputs take "
        "(a binary `circuit` column for a model of one circuit input); empty: the QCNN's generated excitation data set",
    )
    validation_data: str = _key(
        "", "Parquet file or folder to validate on; empty: test_fraction of the rows of `data`, split by seed"
    )
    qubits: Whole = _key(
        8,
        f"the built-in QCNN's qubits: of the cluster state its circuits run on (4..{MAX_QUBITS}; odd counts too)",
        ge=4,
        le=MAX_QUBITS,
    )
    layers: Whole = _key(1, "quantum convolution + pooling layers, from 1 to what the qubits allow (3 for 8 qubits)")
    examples: Whole = _key(160, "excitation circuits in the data set, training and test together (at least 10)", ge=10)
    test_fraction: Number = _key(0.3, "share of the examples held out for testing (validation), between 0 and 1")
    seed: Whole = _key(0, "seeds the data set, the weight initialisation and the shuffling", ge=0)
    epochs: Whole = _key(50, "passes over the training examples", ge=1)
    batch_size: Whole = _key(
        32,
        "examples per step on each worker; the global batch is batch_size x workers (elastic: x the most workers, "
        "each worker taking its share, rounded up, on fewer)",
        ge=1,
    )
    learning_rate: Number = _key(0.02, "Adam's learning rate", gt=0, allow_inf_nan=False)
    hidden_activation: Literal["linear", "relu"] = _key(
        "linear",
        "activation of the Dense(8) layer between the quantum readouts and "
        "the output: linear (the tutorial's model) or relu",
    )
    differentiator: Literal["auto", "block", "tfq"] = _key(
        "auto",
        "quantum gradient of every TFQ expectation layer of the model (PQC, ControlledPQC, Expectation): "
        "auto: qml_ray's block-fused adjoint (BlockAdjoint) where the layer uses TFQ's Adjoint, keeping a "
        "differentiator the model chose, a sampled layer's, and TFQ's where the block method cannot take the "
        "circuit (one warning line); block: BlockAdjoint for every layer, or one error; tfq: as the model built it",
    )
    kernel_plan: str = _key(
        "",
        "fixes the block kernel's choices on every worker, any of: a SIMD path (avx512, avx2, portable), "
        "form=4|3, tiles=15..18, parked=4|5, prefetch=on|off, huge_pages=on|off (`avx2 tiles=17` fixes two); each "
        "worker measures the rest per circuit shape (docs/kernel-notes.md#the-planner); empty: all measured",
    )
    plan_seconds: Number = _key(
        choices.DEFAULT_SECONDS,
        "seconds a worker spends at most measuring the block kernel's choices for a new circuit shape, on its first "
        "step (one choice more is always tried; what is measured is kept for the next run); 0: none measured",
        ge=0,
    )
    data_in_memory_mb: Whole = _key(
        256,
        "a data set of at most this many MB of Parquet is read once and each worker keeps its shard in memory "
        "(reshuffled there every epoch); a larger one streams from storage every epoch; 0: always stream",
        ge=0,
    )
    workers: Whole = _key(
        1,
        "Ray Train workers, one MultiWorkerMirroredStrategy replica each; MIN-MAX (8-32) trains elastically: "
        "min_workers MIN, workers MAX",
        ge=1,
    )
    min_workers: Whole = _key(
        0,
        "elastic training: when nodes are lost, go on at once with as few as this many workers, and grow back to "
        "`workers` when nodes return, the global batch kept (docs/preemption.md#elastic-training); "
        "0: exactly `workers`, a lost one's replacement awaited",
        ge=0,
    )
    cpus_per_worker: Whole = _key(1, "Ray CPUs per worker; also sizes its TensorFlow thread pools", ge=1)
    checkpoint_every: Whole = _key(5, "epochs between checkpoints (the last epoch always is one)", ge=1)
    max_failures: Whole = _key(3, "times Ray Train restarts the workers from the last checkpoint after a failure", ge=0)
    capacity_timeout: Whole = _key(
        0,
        "seconds to wait for the cluster to grow to the workers (autoscaling), at the start and after losing "
        f"workers; 0: fail at once at the start, wait {REPLACEMENT_WAIT_SECONDS} s for lost workers' replacements",
        ge=0,
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
    profiler_port: Whole = _key(
        0, "on-demand TensorFlow profiler server on each worker at this port + its local rank; 0: off"
    )

    serve_batch_size: Whole = _key(
        16, "serve: the most requests a model replica answers with one call of the model (Ray Serve's batch)", ge=1
    )
    serve_batch_wait: Number = _key(
        0.01,
        "serve: seconds a replica waits for more requests to fill a batch before it calls the model",
        ge=0,
        allow_inf_nan=False,
    )
    serve_max_body_mb: Number = _key(
        4, "serve: the largest request body, in MB; a larger one is refused (413)", gt=0, allow_inf_nan=False
    )

    @pydantic.model_validator(mode="before")
    @classmethod
    def _worker_range(cls, values):
        """`workers: MIN-MAX` as min_workers MIN and workers MAX."""
        if not isinstance(values, dict) or not isinstance(values.get("workers"), str):
            return values
        least, dash, most = values["workers"].partition("-")
        if not dash:
            return values
        _require(
            least.strip().isdigit() and most.strip().isdigit(),
            f"workers must be a whole number or MIN-MAX (8-32), got {values['workers']!r}",
        )
        return {**values, "workers": int(most), "min_workers": int(least)}

    @pydantic.field_validator("params", mode="before")
    @classmethod
    def _empty_params(cls, value):
        return {} if value is None else value  # `params:` left empty in a file

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> "Config":
        """The checks across keys, and those whose message says more than a bound."""
        most = max_layers(self.qubits)
        _require(1 <= self.layers <= most, f"layers must be 1..{most} for {self.qubits} qubits")
        _require(0 < self.test_fraction < 1, "test_fraction must be between 0 and 1")
        _require(bool(self.storage), "storage must not be empty")
        _require(self.min_workers <= self.workers, f"min_workers must be at most workers ({self.workers})")
        self.profile_range()
        top = 65535 - self.workers  # room for port + local rank
        _require(
            self.profiler_port == 0 or 1024 <= self.profiler_port <= top,
            f"profiler_port must be 0 (off) or 1024..{top}",
        )
        parse_model(self.model)
        choices.fixed(self.kernel_plan, "kernel_plan")
        if self.callbacks:
            parse_model(self.callbacks, "callbacks")
        for location in (self.storage, self.data, self.validation_data):
            if location:
                storage.check_location(location)
        _require(not self.validation_data or self.data, "validation_data needs data (the training data) too")
        return self

    @property
    def elastic(self) -> bool:
        """Whether training goes on with fewer workers when nodes are lost (min_workers below workers)."""
        return 0 < self.min_workers < self.workers

    @property
    def fewest_workers(self) -> int:
        """The workers training cannot go without: min_workers when elastic, else all of them."""
        return self.min_workers if self.elastic else self.workers

    @property
    def worker_range(self) -> str:
        """The workers as the flag takes them: N, or MIN-MAX when elastic."""
        return f"{self.min_workers}-{self.workers}" if self.elastic else str(self.workers)

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
        """This config with `changes`; the keys it was given and those changed count as given (`given`)."""
        return from_mapping(overlaid(given(self), changes))

    def to_yaml(self) -> str:
        return yaml.safe_dump(asdict(self), sort_keys=False)


def asdict(config: Config) -> dict:
    return config.model_dump()


def overlaid(values: dict, over: dict) -> dict:
    """`values` with `over`'s on top; `workers` given without `min_workers` replaces both (a whole number
    of workers is a fixed count, MIN-MAX sets both)."""
    kept = {key: value for key, value in values.items() if not ("workers" in over and key == "min_workers")}
    return {**kept, **over}


def given(config: Config) -> dict:
    """The keys the config was given (a file's, the flags', keyword arguments'), a default's value too:
    those a resumed run takes over its stored config."""
    return {key: getattr(config, key) for key in config.model_fields_set}


FIELDS = Config.model_fields
CHOICES = {
    key: typing.get_args(f.annotation) for key, f in FIELDS.items() if typing.get_origin(f.annotation) is Literal
}


def doc(key: str) -> str:
    """What a config key means."""
    return FIELDS[key].description


def kind(key: str) -> type:
    """The Python type of a config key's values (int, float, str, bool, dict; str for a choice)."""
    annotation = FIELDS[key].annotation
    if typing.get_origin(annotation) is Literal:
        return str
    return typing.get_origin(annotation) or annotation


def parse_model(spec: str, key: str = "model") -> tuple[str, str]:
    """(module, function) of the MODULE:FUNCTION spec `key` gives, or a UsageError."""
    if not MODEL_SPEC.match(spec):
        raise UsageError(f"{key} must be MODULE:FUNCTION (e.g. mymodels:classifier), got {spec!r}")
    module, function = spec.split(":")
    return module, function


def worker_batch(config: Config, world_size: int) -> int:
    """Examples per step on each of `world_size` workers: their share of the global batch (batch_size x
    workers), rounded up; batch_size on `workers` workers."""
    return -(-config.batch_size * config.workers // world_size)


def split_sizes(config: Config) -> tuple[int, int]:
    """The number of training and of validation examples."""
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
    """Build a validated Config from a mapping, or a UsageError naming the first bad key."""
    try:
        return Config(**values)
    except pydantic.ValidationError as err:
        raise UsageError(_first_problem(err.errors(include_url=False))) from None


def _first_problem(errors: list[dict]) -> str:
    """One line for what pydantic found: the unknown keys, else the first bad value."""
    unknown = [str(error["loc"][0]) for error in errors if error["type"] == "extra_forbidden"]
    if unknown:
        return f"unknown config key(s): {', '.join(sorted(unknown))}"
    error = errors[0]
    key, value, bounds = error["loc"][0], error["input"], error.get("ctx", {})
    if key == "params" and len(error["loc"]) > 1:
        return "params must map names to values"
    if error["type"] in _BOUNDS:  # the value was read: the bound says what is wrong with it
        return f"{key} must be {_BOUNDS[error['type']].format(**bounds)}"
    return f"{key} must be {_expected(key, error['type'], bounds)}, got {reprlib.repr(value)}"


_BOUNDS = {  # what a value must be, by pydantic's error type (its context fills the braces)
    "greater_than_equal": "at least {ge}",
    "greater_than": "more than {gt}",
    "less_than_equal": "at most {le}",
}


def _expected(key: str, kind_of_error: str, context: dict) -> str:
    """What a value of `key` must be, when it is not even of the key's type."""
    if kind_of_error == "finite_number":
        return "a finite number"
    if kind_of_error == "literal_error":
        return f"one of {context['expected']}"
    return _KIND_NAMES[kind(key)]


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
