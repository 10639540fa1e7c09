"""A sweep's results, read from its trials' run folders: one row per trial, results.csv,
results.md (sorted by the sweep's metric) and curves.png (validation loss against epoch)."""

import io
import math

import pandas as pd

from qml_ray import storage

# What --early-stop may judge trials on: metrics most compiled Keras models report.
EARLY_STOP_METRICS = ("val_loss", "val_accuracy", "loss", "accuracy")
MAXIMISED = ("accuracy", "auc", "precision", "recall")  # Keras metrics for which higher is better
RESULTS_CSV, RESULTS_MD, CURVES = "results.csv", "results.md", "curves.png"


def history(run: str) -> pd.DataFrame:
    """A run's metrics.csv (no rows when it has none yet)."""
    path = storage.join(run, storage.HISTORY)
    if not storage.exists(path):
        return pd.DataFrame(columns=["epoch", "loss", "val_loss", *storage.RECORD_FIELDS])
    return pd.read_csv(io.StringIO(storage.read_text(path)))


def mode(metric: str) -> str:
    """Which way is better for a metric: "max" (accuracy, auc, ...) or "min" (losses, errors)."""
    return "max" if any(word in metric for word in MAXIMISED) else "min"


def trial_row(name: str, keys: dict, run: str, epochs: int, error: str = "") -> dict:
    """A trial's row: its swept keys, state, epochs trained, training seconds (the sum of its
    epochs'), and each of its model's metrics at the last epoch (final_) and at its best (best_)."""
    rows = history(run)
    done = len(rows)
    state = f"failed: {error}" if error else "finished" if done >= epochs else f"stopped early at epoch {done}"
    metrics = storage.metric_names(rows.columns)
    best = {key: (rows[key].min() if mode(key) == "min" else rows[key].max()) for key in metrics}
    return {
        "trial": name,
        **keys,
        "state": state,
        "epochs": done,
        "seconds": round(float(rows["epoch_seconds"].sum()), 1),
        **{f"final_{key}": float(rows[key].iloc[-1]) if done else math.nan for key in metrics},
        **{f"best_{key}": float(value) for key, value in best.items()},
        "run": run,
    }


def line(row: dict, metric: str) -> str:
    """One console line about a finished (or stopped, or failed) trial."""
    if not row["epochs"]:
        return f"trial {row['trial']}: {row['state']}"
    line = f"trial {row['trial']}: {row['state']}, {row['epochs']} epochs, {row['seconds']:.0f} s"
    if f"final_{metric}" not in row:  # the model reports no such metric
        return line
    return f"{line}, {metric} {row[f'final_{metric}']:.4f} (best {row[f'best_{metric}']:.4f})"


def ranked(rows: list[dict], metric: str) -> pd.DataFrame:
    """The rows, best trial first by the best value of `metric` (trials without any last)."""
    table = pd.DataFrame(rows)
    if f"best_{metric}" not in table:  # no trial's model reports it
        return table
    return table.sort_values(f"best_{metric}", ascending=mode(metric) == "min", na_position="last", kind="stable")


def write(sweep: str, table: pd.DataFrame) -> None:
    """results.csv, results.md and curves.png in the sweep's folder."""
    storage.write_text(storage.join(sweep, RESULTS_CSV), table.to_csv(index=False))
    storage.write_text(storage.join(sweep, RESULTS_MD), markdown(table))
    storage.write_bytes(storage.join(sweep, CURVES), curves(table))


def markdown(table: pd.DataFrame) -> str:
    def cell(value) -> str:
        return f"{value:.4f}" if isinstance(value, float) and not value.is_integer() else str(value)

    lines = ["| " + " | ".join(table.columns) + " |", "|" + " --- |" * len(table.columns)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def curves(table: pd.DataFrame) -> bytes:
    """Validation loss against epoch, one line per trial, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5))
    for trial, run in zip(table["trial"], table["run"]):
        rows = history(run)
        axes.plot(rows["epoch"], rows["val_loss"], marker="." if len(rows) < 30 else None, label=trial)
    axes.set(xlabel="epoch", ylabel="val_loss", title="validation loss per trial")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small", loc="upper right")
    out = io.BytesIO()
    figure.savefig(out, format="png", dpi=110, bbox_inches="tight")
    plt.close(figure)
    return out.getvalue()
