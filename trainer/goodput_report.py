"""`python -m trainer.goodput_report WORKDIR`: where a run's paid time went, finished or still running.

Reads the goodput events of every attempt in WORKDIR/goodput/ (local or gs://, through etils.epath)
and prints the table of trainer.measure.goodput_accounting: productive step time, then each badput category
(ml-goodput-measurement's names), in seconds and as a share of the wall time.
"""

from __future__ import annotations

import argparse
import sys

from trainer import run_identity, storage
from trainer.errors import OneLineParser, UserError, entry_point
from trainer.measure import goodput_accounting
from trainer.measure.run_events import EVENTS_DIR, read_attempts


def run_breakdown(workdir: str) -> goodput_accounting.Breakdown:
    """The breakdown of the run in `workdir`; a UserError when it holds no events."""
    from etils import epath  # only when asked: gs:// needs its cloud backend

    directory = epath.Path(workdir) / EVENTS_DIR
    storage.check_reachable("", workdir)
    with storage.reading("", workdir):
        run = run_identity.recorded(epath.Path(workdir))
        attempts = [events for events in read_attempts(directory, run=run) if events]
    if not attempts:
        raise UserError(f"{workdir}: no goodput events there (no {EVENTS_DIR}/events-*.jsonl); pass the --workdir of a "
                        "`python -m trainer` run")
    return goodput_accounting.account(attempts)


@entry_point(prefix="trainer.goodput_report: ")
def main(argv=None) -> int | None:
    parser = OneLineParser(prog="python -m trainer.goodput_report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdir", help="the run's --workdir (a local folder or gs://BUCKET/PATH)")
    args = parser.parse_args(argv)
    breakdown = run_breakdown(args.workdir)
    print(goodput_accounting.format_table(breakdown, title=f"goodput of {args.workdir}: {breakdown.goodput:.1%} over "
                                                f"{breakdown.attempts} attempt{'s' if breakdown.attempts != 1 else ''}"))


if __name__ == "__main__":
    sys.exit(main())
