"""`python -m qml_ray.infer`: Ray Data batch inference with a run's trained weights.

Ray Data reads the run's test split (or --data), a pool of actors each holding the
model (built from the run's config, weights loaded once) predicts batch by batch, and
the predictions land as Parquet in <run>/predictions/<timestamp>/.
"""

import logging
import os
import time

import numpy as np

from qml_ray import cli, config as config_lib, interrupts, runtime, storage
from qml_ray.errors import UsageError


def parse_args(argv=None):
    parser = cli.ArgumentParser(
        prog="python -m qml_ray.infer",
        description="Batch inference over a trained run's weights with Ray Data.",
    )
    parser.add_argument("--run", required=True, help="the run folder, e.g. runs/20260101-120000")
    parser.add_argument(
        "--data", metavar="PARQUET", help="Parquet with a 'circuit' column (default: the run's test split)"
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
    from qml_ray.model import build_model

    config = config_lib.of_run(run)
    weights = storage.join(run, storage.WEIGHTS)
    if not storage.is_complete(weights):
        raise UsageError(f"no weights in {weights}: has the run finished training?")
    model = build_model(config)
    try:
        with storage.local_copy(weights) as folder:
            model.load_weights(os.path.join(folder, storage.WEIGHTS_PREFIX)).expect_partial()
    except UsageError:
        raise
    except Exception as err:  # TF reports damaged or mismatched checkpoints with many error types
        raise UsageError(f"cannot load the weights in {weights} into this run's model: {err}") from None
    return model


def circuit_problem(serialized, qubits: int) -> str | None:
    """Why `serialized` is not a circuit the model of `qubits` qubits can take, or None."""
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
    outside = sorted(set(circuit.all_qubits()) - set(cirq.GridQubit.rect(1, qubits)))
    if outside:
        shown = ", ".join(map(str, outside))
        return f"on {shown}, not among the model's {qubits} qubits q(0, 0)..q(0, {qubits - 1})"
    return None


def check_data(data_path: str, qubits: int) -> None:
    """Fail in one line unless `data_path` is Parquet with a binary `circuit` column whose first row
    the model of `qubits` qubits can take (the actors check every row)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    filesystem, path = storage.pyarrow_filesystem(data_path)
    try:
        dataset = ds.dataset(path, format="parquet", filesystem=filesystem)
        schema = dataset.schema
        first = dataset.head(1, columns=["circuit"]).column(0).to_pylist() if "circuit" in schema.names else []
    except (OSError, pa.ArrowException) as err:
        raise UsageError(f"cannot read {data_path} as Parquet: {err}") from None
    if "circuit" not in schema.names:
        raise UsageError(f"{data_path} has no 'circuit' column (its columns: {', '.join(schema.names)})")
    kind = schema.field("circuit").type
    if not (pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_string(kind)):
        raise UsageError(f"the 'circuit' column of {data_path} must hold serialized circuits (binary), not {kind}")
    if not first:
        raise UsageError(f"{data_path} has no rows")
    problem = circuit_problem(first[0], qubits)
    if problem:
        raise UsageError(f"the circuit of the first row of {data_path} is {problem}")


PROBLEM = "problem"  # the actors' column of what is wrong with a row's circuit (empty: nothing)


class QCNNPredictor:
    """Ray Data callable class: one model per actor, loaded once, applied to every batch."""

    def __init__(self, run: str):
        self.model = load_trained_model(run)
        self.qubits = config_lib.of_run(run).qubits

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The batch's columns but `circuit`, its predictions, and per row what is wrong with its
        circuit (PROBLEM; empty when nothing, and then its prediction is NaN)."""
        import tensorflow as tf

        circuits = list(batch.pop("circuit"))
        problems = np.array([circuit_problem(circuit, self.qubits) or "" for circuit in circuits], dtype=object)
        good = problems == ""
        predictions = np.full(len(circuits), np.nan, np.float32)
        if good.any():
            inputs = tf.constant([circuit for circuit, ok in zip(circuits, good) if ok], dtype=tf.string)
            predictions[good] = self.model(inputs, training=False).numpy()[:, 0]
        return {**batch, "prediction": predictions, PROBLEM: problems}


def predict(run: str, data_path: str, actors: int, batch_size: int):
    """Predict every row of `data_path`; the result is materialised in the object store."""
    import ray.data

    filesystem, path = storage.pyarrow_filesystem(data_path)
    return (
        ray.data.read_parquet(path, filesystem=filesystem)
        .map_batches(
            QCNNPredictor,
            fn_constructor_kwargs={"run": run},
            batch_size=batch_size,
            compute=ray.data.ActorPoolStrategy(size=actors),
            num_cpus=1,
            runtime_env={"env_vars": runtime.worker_env(1)},
        )
        .materialize()
    )


def without_bad_rows(predictions):
    """The predictions less the PROBLEM column, or a UsageError naming the first row whose circuit
    the actors could not take."""
    problems = predictions.select_columns([PROBLEM, *(["id"] if "id" in predictions.columns() else [])]).to_pandas()
    bad = problems[problems[PROBLEM] != ""]
    if len(bad):
        row = f"id {bad.iloc[0]['id']}" if "id" in bad else str(bad.index[0])
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise UsageError(f"the circuit of row {row} is {bad.iloc[0][PROBLEM]}{more}")
    return predictions.drop_columns([PROBLEM])


def write_predictions(predictions, run: str) -> str:
    """Write a new predictions folder, marked complete once every file is in."""
    out = storage.join(run, storage.PREDICTIONS, time.strftime("%Y%m%d-%H%M%S"))
    filesystem, path = storage.pyarrow_filesystem(out)
    predictions.write_parquet(path, filesystem=filesystem)
    storage.mark_complete(out)
    return out


def main(argv=None) -> None:
    args = parse_args(argv)
    interrupts.say_on_interrupt("no predictions were completed; run the command again")
    for location in filter(None, (args.run, args.data)):
        storage.check_location(location)
    run = storage.absolute(args.run)
    data_path = storage.absolute(args.data) if args.data else storage.split_path(run, "test")
    config = config_lib.of_run(run)
    if not storage.exists(data_path):
        raise UsageError(f"no data at {data_path}")
    with cli.native_stderr_hidden(not args.verbose):
        check_data(data_path, config.qubits)
        load_trained_model(run)  # fail here, in one line, rather than inside an actor
        runtime.connect(args.address, log_to_driver=args.verbose)
        if not args.verbose:
            import ray.data  # noqa: F401  (it sets its loggers' levels on import; its progress lines are INFO)

            logging.getLogger("ray.data").setLevel(logging.WARNING)
        runtime.require_capacity(
            args.actors + 1,
            1,
            "inference actor(s) plus one CPU for Ray Data's reads",
            "lower --actors",
            config.capacity_timeout,
        )
        runtime.require_memory(
            config_lib.state_bytes(config.qubits, 1),
            f"an inference actor's state vectors ({config.qubits} qubits)",
            "run inference on a cluster with more memory per node",
        )
        predictions = predict(run, data_path, args.actors, args.batch_size)
    predictions = without_bad_rows(predictions)
    out = write_predictions(predictions, run)
    table = predictions.to_pandas()
    print(f"predicted {len(table)} circuits with {args.actors} actor(s); predictions in {out}")
    if "label" in table:
        errors = table["prediction"] - table["label"]
        accuracy = np.mean(np.where(table["prediction"] >= 0, 1.0, -1.0) == table["label"])
        print(f"mse {np.mean(errors**2):.4f}  accuracy {accuracy:.3f}")


if __name__ == "__main__":
    cli.run(main)
