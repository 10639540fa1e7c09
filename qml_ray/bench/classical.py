"""`python -m qml_ray.bench classical`: a model of classical features, TFQ's re-uploading PQC as a
classifier (examples/reuploading.py, run from the project's folder), whose every batch repeats one
program (empty circuits, tiled) with per-example symbol values.

- The cost per circuit: forward + gradient of one batch through the model, with the block gradient
  (`differentiator auto`) and with TFQ's Adjoint (`tfq`), at each qubit count.
- Training, side by side in rounds: `python -m qml_ray.train` on 2 workers (a local Ray of its own)
  against plain Keras with TFQ's Adjoint in this process, the same data, held-out rows, global batch
  and epochs; the steady epoch (the median of epochs 2 onwards) and the final validation accuracy.
"""

import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from qml_ray import config as config_lib, datasets, features
from qml_ray.errors import UsageError

EXAMPLE = "examples.reuploading"
MODEL = f"{EXAMPLE}:classifier"


def example():
    """The example's module, importable from the project's folder."""
    import importlib

    try:
        return importlib.import_module(EXAMPLE)
    except ModuleNotFoundError:
        raise UsageError(f"bench classical needs {EXAMPLE}: run it from the project's folder") from None


def cost_per_circuit(qubits: list[int], batch: int, min_seconds: float) -> list[dict]:
    """Seconds per circuit of forward + gradient, block against TFQ's Adjoint, at each qubit count."""
    import tensorflow as tf

    from qml_ray import quantum_layers
    from qml_ray.bench.measure import seconds_per_call

    rows = []
    for count in qubits:
        points = tf.constant(np.random.default_rng(count).uniform(-1, 1, (batch, count)), tf.float32)
        labels = tf.constant(np.random.default_rng(count + 1).integers(0, 2, (batch, 1)), tf.float32)
        row = {"qubits": count, "circuits": batch}
        for rule, name in (("auto", "block"), ("tfq", "tfq")):
            model = example().classifier(n_qubits=count)
            quantum_layers.gradients(model, rule)

            def step(model=model, points=points, labels=labels):
                with tf.GradientTape() as tape:
                    loss = model.compiled_loss(labels, model(points, training=True))
                return tape.gradient(loss, model.trainable_variables)

            step()  # traced and warm
            row[f"{name}_seconds"] = seconds_per_call(step, min_seconds) / batch
        row["tfq_over_block"] = row["tfq_seconds"] / row["block_seconds"]
        print(
            f"    {count} qubits: block {row['block_seconds']:.3g}, TFQ {row['tfq_seconds']:.3g} s/circuit", flush=True
        )
        rows.append(row)
    return rows


def plain_keras(data: Path, config: config_lib.Config) -> dict:
    """The example trained by Keras in this process with TFQ's Adjoint, on the rows qml_ray trains and
    validates on (the same held-out rule), at qml_ray's global batch."""
    import tensorflow as tf

    source = datasets.describe(str(data))
    table = datasets.read_paths(source.paths, source.usable)
    columns = datasets.numpy_columns(table, source.usable)
    held = datasets.held_out(features.row_keys(columns), config.seed, config.test_fraction)
    points = np.stack(columns["features"]).astype(np.float32)
    labels = columns["label"].astype(np.float32).reshape(-1, 1)
    model = example().classifier(seed=config.seed)  # TFQ's Adjoint, as built
    seconds = []  # each epoch's, validation included
    clock = tf.keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: seconds.append(-time.perf_counter()),
        on_epoch_end=lambda epoch, logs: seconds.append(seconds.pop() + time.perf_counter()),
    )
    history = model.fit(
        points[~held],
        labels[~held],
        batch_size=config.batch_size * config.workers,
        epochs=config.epochs,
        validation_data=(points[held], labels[held]),
        callbacks=[clock],
        verbose=0,
    )
    return {"steady_epoch_seconds": statistics.median(seconds[1:]), "val_accuracy": history.history["val_accuracy"][-1]}


def qml_ray_training(data: Path, config: config_lib.Config, storage: Path, name: str, timeout: float) -> dict:
    """`python -m qml_ray.train` of the example on `config.workers` workers (a local Ray of its own)."""
    options = ("--model", MODEL, "--data", data, "--workers", config.workers, "--epochs", config.epochs)
    options += ("--batch-size", config.batch_size, "--seed", config.seed, "--test-fraction", config.test_fraction)
    command = [sys.executable, "-m", "qml_ray.train", *map(str, options), "--storage", str(storage), "--name", name]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        sys.exit(f"error: the qml_ray training failed: {done.stderr.strip().splitlines()[-1:]}")
    history = pd.read_csv(storage / name / "metrics.csv")
    return {
        "steady_epoch_seconds": float(history["epoch_seconds"].iloc[1:].median()),
        "val_accuracy": float(history["val_accuracy"].iloc[-1]),
    }


def training(out: Path, config: config_lib.Config, rounds: int, timeout: float) -> list[dict]:
    """Both runtimes in interleaved rounds on the example's data set (written to <out>/data)."""
    data = out / "data"
    if not data.exists():
        example().make_data(str(data))
    records = []
    for round_ in range(rounds):
        for runtime in ("plain_keras", "qml_ray"):
            print(f"    round {round_ + 1}: {runtime} ...", flush=True)
            if runtime == "plain_keras":
                found = plain_keras(data, config)
            else:
                found = qml_ray_training(data, config, out / "runs", f"round-{round_ + 1}", timeout)
            records.append({"round": round_ + 1, "runtime": runtime, **found})
    return records


def markdown(doc: dict) -> str:
    lines = [
        f"Cost per circuit, forward + gradient, {doc['threads']} thread(s), batch of {doc['costs'][0]['circuits']}:",
        "",
        "| qubits | block (ms/circuit) | TFQ Adjoint (ms/circuit) | TFQ / block |",
        "| ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r['qubits']} | {1e3 * r['block_seconds']:.3g} | {1e3 * r['tfq_seconds']:.3g} | {r['tfq_over_block']:.2f} |"
        for r in doc["costs"]
    ]
    lines += [
        "",
        "| runtime | steady epoch (s), each round | median | val_accuracy, each round |",
        "| --- | --- | ---: | --- |",
    ]
    for runtime in ("plain_keras", "qml_ray"):
        runs = [r for r in doc["records"] if r["runtime"] == runtime]
        epochs = ", ".join(f"{r['steady_epoch_seconds']:.3f}" for r in runs)
        median = statistics.median(r["steady_epoch_seconds"] for r in runs)
        accuracy = ", ".join(f"{r['val_accuracy']:.3f}" for r in runs)
        lines.append(f"| {runtime} | {epochs} | {median:.3f} | {accuracy} |")
    return "\n".join(lines) + "\n"
