"""`python -m qml_ray.infer` and `qml_ray.predict`: Ray Data batch inference with a run's weights.

Ray Data reads the run's validation data (or --data), a pool of actors each holding the model
(rebuilt from the run's `model` and `params`, weights loaded once) predicts batch by batch, its
inputs fed from the columns of their names (features.py), and the predictions (a `prediction`
column beside the data's other columns, less its circuits) land as Parquet in
<run>/predictions/<timestamp>/. With labels in the data, the model's compiled loss and metrics
are printed.
"""

import time

import numpy as np

from qml_ray import cli, config as config_lib, contract, datasets, features, interrupts, runtime, storage
from qml_ray.errors import UsageError


def parse_args(argv=None):
    parser = cli.ArgumentParser(
        prog="python -m qml_ray.infer",
        description="Batch inference over a trained run's weights with Ray Data.",
    )
    parser.add_argument("--run", required=True, help="the run folder, e.g. runs/20260101-120000")
    parser.add_argument(
        "--data",
        metavar="PARQUET",
        help="Parquet file or folder with the columns the model's inputs take, e.g. 'circuit' "
        "(default: the run's validation data)",
    )
    parser.add_argument("--actors", type=int, default=1, metavar="N", help="model-holding actors (default: 1)")
    parser.add_argument("--batch-size", type=int, default=64, metavar="N", help="circuits per batch (default: 64)")
    cli.add_address_flag(parser)
    cli.add_verbose_flag(parser)
    args = parser.parse_args(argv)
    if args.actors < 1 or args.batch_size < 1:
        parser.error("--actors and --batch-size must be at least 1")
    return args


def load_trained_model(run: str):
    """The run's model with its final weights, or a UsageError saying why it cannot be had."""
    from qml_ray import replica

    return with_weights(replica.build(config_lib.of_run(run), contract.recorded(run)), run)


def with_weights(model, run: str):
    """`model` (the run's, as built) with the run's final weights loaded, or a UsageError."""
    weights = storage.join(run, storage.WEIGHTS)
    if not storage.is_complete(weights):
        raise UsageError(f"no weights in {weights}: has the run finished training?")
    try:
        with storage.local_copy(weights) as folder:
            model.load_weights(storage.weights_in(folder)).expect_partial()
    except UsageError:
        raise
    except Exception as err:  # TF reports damaged or mismatched checkpoints with many error types
        raise UsageError(f"cannot load the weights in {weights} into this run's model: {err}") from None
    return model


def model_qubits(model) -> list:
    """The qubits of the circuits the model's TFQ layers hold; empty when it has none such."""
    from qml_ray import quantum_layers

    return sorted(quantum_layers.qubits(model))


def circuit_problem(serialized, qubits: list) -> str | None:
    """Why `serialized` is not a circuit a model on `qubits` (none: any) can take, or None."""
    import cirq
    import tensorflow_quantum as tfq

    if not isinstance(serialized, bytes | str):
        return f"a {type(serialized).__name__}, not a serialized circuit"
    try:
        circuit = tfq.from_tensor([serialized])[0]
    except Exception:  # TFQ reports undecodable bytes as TypeError, parse failures as others
        circuit = None
    if not isinstance(circuit, cirq.Circuit):
        return "not a serialized TFQ circuit"
    outside = sorted(set(circuit.all_qubits()) - set(qubits)) if qubits else []
    if outside:
        shown = ", ".join(map(str, outside))
        return f"on {shown}, not among the model's {len(qubits)} qubits {qubits[0]}..{qubits[-1]}"
    return None


def check_data(data_path: str, source: datasets.Source, model) -> list[bytes]:
    """The first row's circuits of `data_path` (described by `source`); fail in one line unless its
    columns feed the model's inputs, its circuits are circuits `model` can take (the actors check every
    row), and its labels, if any, fit the model's output."""
    import pyarrow.dataset as ds

    feed = features.feed(features.model_inputs(model), source.columns, data_path)
    first_file = next(path for path, _, rows in source.files if rows)
    filesystem, path = storage.pyarrow_filesystem(first_file)
    first = ds.dataset(path, format="parquet", filesystem=filesystem).head(1, columns=feed.circuit_columns)
    circuits = [first.column(name).to_pylist()[0] for name in feed.circuit_columns]
    for name, circuit in zip(feed.circuit_columns, circuits):
        if problem := circuit_problem(circuit, model_qubits(model)):
            raise UsageError(f"the {name} of the first row of {data_path} is {problem}")
    outputs = model.output_shape[1:] or (1,)
    if source.label_width and (source.label_width,) != outputs:
        raise UsageError(
            f"the labels of {data_path} hold {source.label_width} value(s) per row, the model outputs {outputs[0]}"
        )
    return circuits


PROBLEM = "problem"  # the actors' column of what is wrong with a row's circuit (empty: nothing)


class Predictor:
    """Ray Data callable class: one model per actor, loaded once, applied to every batch."""

    def __init__(self, run: str, columns: tuple):
        from qml_ray import worker_setup

        with worker_setup.collector_paused():
            self.model = load_trained_model(run)
        self.qubits = model_qubits(self.model)
        self.feed = features.feed(features.model_inputs(self.model), columns, run)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The batch's columns but the circuits it feeds the model, its predictions, and per row what is
        wrong with its circuits (PROBLEM; empty when nothing, and then its prediction is NaN)."""
        rows = len(next(iter(batch.values())))
        circuits = {name: batch.pop(name) for name in self.feed.circuit_columns}
        problems = np.array([self.problem(circuits, row) for row in range(rows)], dtype=object)
        good = problems == ""
        outputs = self.model.output_shape[1:] or (1,)
        predictions = np.full((rows, *outputs), np.nan, np.float32)
        if good.any():
            inputs = self.feed.inputs({name: values[good] for name, values in {**batch, **circuits}.items()})
            predictions[good] = self.model(inputs, training=False).numpy().reshape(-1, *outputs)
        column = predictions[:, 0] if outputs == (1,) else list(predictions)  # a float, or a list per row
        return {**batch, "prediction": column, PROBLEM: problems}

    def problem(self, circuits: dict, row: int) -> str:
        """What is wrong with a row's circuits (the first found), or ''."""
        found = ((name, circuit_problem(values[row], self.qubits)) for name, values in circuits.items())
        return next((f"{name}: {problem}" for name, problem in found if problem), "")


def predictions_of(run: str, data, columns: tuple, actors: int, batch_size: int):
    """Predict every row of the Ray Dataset `data` (its `columns` described); the result is
    materialised in the object store."""
    import ray.data

    return data.map_batches(
        Predictor,
        fn_constructor_kwargs={"run": run, "columns": columns},
        batch_size=batch_size,
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_cpus=1,
        runtime_env={"env_vars": runtime.worker_env(1)},
    ).materialize()


def without_bad_rows(predictions):
    """The predictions less the PROBLEM column, or a UsageError naming the first row whose circuit
    the actors could not take."""
    problems = predictions.select_columns([PROBLEM, *(["id"] if "id" in predictions.columns() else [])]).to_pandas()
    bad = problems[problems[PROBLEM] != ""]
    if len(bad):
        row = f"id {bad.iloc[0]['id']}" if "id" in bad else str(bad.index[0])
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        column, _, problem = bad.iloc[0][PROBLEM].partition(": ")
        raise UsageError(f"the {column} of row {row} is {problem}{more}")
    return predictions.drop_columns([PROBLEM])


def write_predictions(predictions, run: str) -> str:
    """Write a new predictions folder, marked complete once every file is in; a write that fails or is
    interrupted (Ctrl-C, SIGTERM) removes the folder before the command ends: none is left half-written."""
    out = storage.join(run, storage.PREDICTIONS, time.strftime("%Y%m%d-%H%M%S"))
    filesystem, path = storage.pyarrow_filesystem(out)
    try:
        predictions.write_parquet(path, filesystem=filesystem)
        storage.mark_complete(out)
    except BaseException:
        storage.remove_folder(out)
        raise
    return out


def scores(model, predictions) -> dict:
    """The model's compiled loss and metrics over the predictions' `label` and `prediction` columns."""
    import tensorflow as tf

    table = predictions.select_columns(["label", "prediction"]).to_pandas()
    width = (model.output_shape[1:] or (1,))[0]
    labels, predicted = (
        tf.constant(np.stack(table[column].to_numpy()).reshape(len(table), width), tf.float32)
        for column in ("label", "prediction")
    )
    model.compiled_metrics.reset_state()
    model.compiled_metrics.update_state(labels, predicted)
    found = {"loss": float(model.compiled_loss(labels, predicted))}
    return found | {metric.name: float(metric.result()) for metric in model.compiled_metrics.metrics}


def infer(
    run: str,
    data: str | None = None,
    actors: int = 1,
    batch_size: int = 64,
    address: str | None = None,
    verbose: bool = False,
) -> str:
    """Predict every row of `data` (default: the run's validation data) with run `run`'s weights and
    return the predictions folder: what the command and `qml_ray.predict` do. Bad input raises
    UsageError before anything is written."""
    for location in filter(None, (run, data)):
        storage.check_location(location)
    run, data = storage.absolute(run), data and storage.absolute(data)
    config = config_lib.of_run(run)
    with cli.native_stderr_hidden(not verbose):
        model, rows, columns, first = checked_inputs(run, config, data)
        join_cluster(config, address, verbose, actors, model, first)
        predictions = predictions_of(run, rows(), columns, actors, batch_size)
    predictions = without_bad_rows(predictions)
    out = write_predictions(predictions, run)
    print(f"predicted {predictions.count()} rows with {actors} actor(s); predictions in {out}", flush=True)
    if "label" in predictions.columns():
        print("  ".join(f"{key} {value:.4f}" for key, value in scores(model, predictions).items()), flush=True)
    return out


def checked_inputs(run: str, config: config_lib.Config, data: str | None) -> tuple:
    """The run's model with its weights, a maker of the Ray Dataset to predict (`data`, or the run's
    validation rows), its columns, and its first row's circuits (when `data` is given: checked against
    the model); a UsageError for what does not fit, before Ray starts."""
    from qml_ray import replica

    source = datasets.describe(data, needs_label=False) if data else None
    splits = None if data else datasets.sources(config, run)
    model = replica.build(config, contract.recorded(run))
    first = check_data(data, source, model) if data else []
    with_weights(model, run)  # fail here, in one line, rather than inside an actor

    def rows():
        return datasets.read(source) if data else datasets.splits(config, *splits)["validation"]

    return model, rows, (source or splits[0]).columns, first


def join_cluster(config: config_lib.Config, address: str | None, verbose: bool, actors: int, model, first) -> None:
    """Join Ray, and make sure it can place the actors and hold their state vectors (the model's
    qubits and those of the data's `first` circuits)."""
    from qml_ray import quantum_layers

    runtime.connect(address, log_to_driver=verbose)
    runtime.quiet_ray_data(verbose)
    runtime.require_capacity(actors, 1, "inference actor(s)", "lower --actors", config.capacity_timeout)
    runtime.require_state_memory(
        len(quantum_layers.qubits(model, first)),
        1,
        "an inference actor",
        "run inference on a cluster with more memory per node",
    )


def main(argv=None) -> None:
    args = parse_args(argv)
    interrupts.say_on_interrupt("no predictions were completed; run the command again")
    infer(args.run, args.data, args.actors, args.batch_size, args.address, args.verbose)
    runtime.leave()


if __name__ == "__main__":
    cli.run(main)
