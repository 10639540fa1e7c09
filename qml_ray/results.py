"""A sweep's results, read from its trials' run folders: one row per trial, results.csv,
results.md (sorted by the sweep's metric) and curves.png (validation loss against epoch)."""

import io
import math

import pandas as pd

from qml_ray import storage

# The metrics a trial reports every epoch, and which way is better.
MODES = {"val_loss": "min", "val_accuracy": "max", "loss": "min", "accuracy": "max"}
RESULTS_CSV, RESULTS_MD, CURVES = "results.csv", "results.md", "curves.png"


def history(run: str) -> pd.DataFrame:
    """A run's metrics.csv (no rows when it has none yet)."""
    path = storage.join(run, storage.HISTORY)
    if not storage.exists(path):
        return pd.DataFrame(columns=["epoch", *MODES, "epoch_seconds"])
    return pd.read_csv(io.StringIO(storage.read_text(path)))


def trial_row(name: str, keys: dict, run: str, epochs: int, error: str = "") -> dict:
    """A trial's row: its swept keys, state, epochs trained, training seconds (the sum of its
    epochs'), and its metrics at the last epoch (final_) and at their best (best_)."""
    rows = history(run)
    done = len(rows)
    state = f"failed: {error}" if error else "finished" if done >= epochs else f"stopped early at epoch {done}"
    best = {key: (rows[key].min() if mode == "min" else rows[key].max()) for key, mode in MODES.items()}
    return {
        "trial": name,
        **keys,
        "state": state,
        "epochs": done,
        "seconds": round(float(rows["epoch_seconds"].sum()), 1),
        **{f"final_{key}": float(rows[key].iloc[-1]) if done else math.nan for key in MODES},
        **{f"best_{key}": float(value) for key, value in best.items()},
        "run": run,
    }


def line(row: dict, metric: str) -> str:
    """One console line about a finished (or stopped, or failed) trial."""
    if not row["epochs"]:
        return f"trial {row['trial']}: {row['state']}"
    return (
        f"trial {row['trial']}: {row['state']}, {row['epochs']} epochs, {row['seconds']:.0f} s, "
        f"{metric} {row[f'final_{metric}']:.4f} (best {row[f'best_{metric}']:.4f})"
    )


def ranked(rows: list[dict], metric: str) -> pd.DataFrame:
    """The rows, best trial first by the best value of `metric` (trials without any last)."""
    table = pd.DataFrame(rows)
    return table.sort_values(f"best_{metric}", ascending=MODES[metric] == "min", na_position="last", kind="stable")


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
