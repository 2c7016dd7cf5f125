"""The loss curve of a run as a PNG: `python -m trainer.measure.plot WORKDIR/metrics.jsonl [--output loss.png]`."""

import argparse
import pathlib
import sys

from trainer.errors import UserError, entry_point
from trainer.run.metrics import read_metrics
from trainer.shared_files import replaced_atomically


def series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of `key`, one point per step: a resumed run re-reports the steps after its
    checkpoint, and the later report of a step wins."""
    by_step = {record["step"]: record[key] for record in records if record.get(key) is not None}
    steps = sorted(by_step)
    return steps, [by_step[step] for step in steps]


def plot_loss(metrics_jsonl, png_path) -> pathlib.Path:
    """Train loss (and eval loss when the run reported one) against step, written to `png_path`."""
    # The figure is drawn on the Agg canvas directly: no pyplot, no display, no global backend.
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise UserError(f"drawing {png_path} needs matplotlib, which is not installed ({error}); pip install matplotlib") from None

    records = read_metrics(metrics_jsonl)
    train_steps, train_loss = series(records, "loss")
    if not train_steps:
        raise UserError(f"{metrics_jsonl} holds no finite 'loss' values to plot")
    eval_steps, eval_loss = series(records, "eval_loss")

    figure = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.plot(train_steps, train_loss, label="train loss")
    if eval_steps:
        axes.plot(eval_steps, eval_loss, "o-", label="eval loss")
    axes.set_xlabel("step")
    axes.set_ylabel("loss")
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    png_path = pathlib.Path(png_path)
    with replaced_atomically(png_path) as temporary:
        figure.savefig(temporary, format="png")
    return png_path


@entry_point()
def main(argv=None) -> int | None:
    parser = argparse.ArgumentParser(prog="python -m trainer.measure.plot", description=__doc__)
    parser.add_argument("metrics", help="a metrics.jsonl written by the trainer")
    parser.add_argument("--output", help="PNG to write (default: loss.png beside the metrics file)")
    args = parser.parse_args(argv)
    output = args.output or pathlib.Path(args.metrics).with_name("loss.png")
    print(plot_loss(args.metrics, output))


if __name__ == "__main__":
    sys.exit(main())
