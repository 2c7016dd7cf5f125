"""Goodput accounting on hand-written attempts, and the event log that records them."""

import json
import math
import pathlib
import signal
import subprocess
import sys

import pytest

from trainer import contract
from trainer.goodput_report import main, run_breakdown
from trainer.measure import goodput_accounting
from trainer.measure.goodput_accounting import PRODUCTIVE, account
from trainer.measure.run_events import EVENTS_DIR, EventLog, read_attempts


def _attempt(start, *, init, ready, start_step, steps, saves=(), evals=(), end=None, restore=None, compile_s=0.0):
    """Events of one attempt: `steps` are (first, last, end time, seconds, data seconds)."""
    events = [{"event": "start", "time": start}, {"event": "init", "time": init}]
    if restore is not None:
        step, at, seconds = restore
        events.append({"event": "restore", "time": at, "seconds": seconds, "step": step})
    if compile_s:
        events.append({"event": "compile", "time": ready, "seconds": compile_s})
    events.append({"event": "ready", "time": ready, "start_step": start_step})
    events += [{"event": "steps", "first": first, "last": last, "time": at, "seconds": seconds, "data_seconds": data}
               for first, last, at, seconds, data in steps]
    events += [{"event": "save", "time": at, "seconds": seconds, "step": step} for step, at, seconds in saves]
    events += [{"event": "eval", "time": at, "seconds": seconds} for at, seconds in evals]
    if end is not None:
        events.append({"event": "end", "time": end, "status": "done"})
    return events


def _sums_to_wall(breakdown, wall):
    assert math.isclose(sum(breakdown.seconds.values()), wall, rel_tol=0.01)
    assert all(value >= 0 for value in breakdown.seconds.values()), breakdown.seconds


def test_a_clean_run():
    run = _attempt(100.0, init=110.0, ready=130.0, start_step=0, compile_s=8.0,
                   steps=[(1, 10, 150.0, 15.0, 2.0), (11, 20, 170.0, 16.0, 1.0)],
                   saves=[(20, 171.0, 1.0)], evals=[(160.0, 2.0)], end=180.0)
    breakdown = account([run])
    _sums_to_wall(breakdown, 80.0)
    seconds = breakdown.seconds
    assert seconds[PRODUCTIVE] == 31.0 and breakdown.goodput == pytest.approx(31.0 / 80.0)
    assert seconds["TPU_INITIALIZATION"] == 10.0
    assert seconds["PROGRAM_STARTUP"] == 8.0 and seconds["TRAINING_PREP"] == 12.0
    assert seconds["DATA_LOADING_SYNC"] == 3.0 and seconds["UNPRODUCTIVE_CHECKPOINT_SAVE_TIME"] == 1.0
    assert seconds["WASTED_PROGRESS_FROM_DISRUPTION"] == 0 and seconds["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] == 0
    assert seconds["OTHER"] == pytest.approx(50.0 - 31.0 - 3.0 - 1.0 - 2.0 + 2.0)  # the eval is OTHER too


def test_a_killed_run_resumed_from_an_earlier_checkpoint_counts_the_lost_steps_at_their_first_time():
    # Killed after step 30 (last event at 170): the checkpoint of step 20 was the newest complete one.
    first = _attempt(100.0, init=110.0, ready=120.0, start_step=0,
                     steps=[(1, 10, 140.0, 18.0, 1.0), (11, 20, 155.0, 14.0, 0.0), (21, 30, 170.0, 12.0, 0.0)],
                     saves=[(20, 156.0, 1.0)])
    # Restarted 30 s later, resumed after step 20, recomputed 21..30 faster and finished at 40.
    second = _attempt(200.0, init=205.0, ready=215.0, start_step=20, restore=(20, 212.0, 3.0),
                      steps=[(21, 30, 225.0, 9.0, 0.0), (31, 40, 235.0, 9.0, 0.0)], end=240.0)
    breakdown = account([second, first])  # any order
    _sums_to_wall(breakdown, 140.0)
    seconds = breakdown.seconds
    assert seconds["WASTED_PROGRESS_FROM_DISRUPTION"] == 12.0  # the first attempt's time on 21..30
    assert seconds[PRODUCTIVE] == 18.0 + 14.0 + 9.0 + 9.0
    assert seconds["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] == 30.0
    assert seconds["UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"] == 3.0
    assert seconds["TPU_INITIALIZATION"] == 15.0 and seconds["TRAINING_PREP"] == 10.0 + 7.0
    assert breakdown.attempts == 2


def test_a_record_that_straddles_the_resumed_checkpoint_is_lost_in_proportion():
    first = _attempt(0.0, init=1.0, ready=2.0, start_step=0, steps=[(1, 10, 12.0, 10.0, 0.0)])
    second = _attempt(20.0, init=21.0, ready=22.0, start_step=4, steps=[(5, 10, 28.0, 6.0, 0.0)], end=28.0)
    breakdown = account([first, second])
    assert breakdown.seconds["WASTED_PROGRESS_FROM_DISRUPTION"] == pytest.approx(6.0)
    assert breakdown.seconds[PRODUCTIVE] == pytest.approx(4.0 + 6.0)
    _sums_to_wall(breakdown, 28.0)


def test_an_attempt_that_died_before_its_loop_and_one_cut_by_the_next_start():
    died = [{"event": "start", "time": 0.0}, {"event": "init", "time": 5.0}]  # no ready: the rest is preparation
    # A later attempt that began before the previous one's last event (clocks of two hosts): cut there.
    overlapping = _attempt(10.0, init=12.0, ready=14.0, start_step=0, steps=[(1, 5, 40.0, 20.0, 1.0)])
    last = _attempt(30.0, init=31.0, ready=32.0, start_step=0, steps=[(1, 5, 42.0, 10.0, 0.0)], end=42.0)
    breakdown = account([died, overlapping, last])
    _sums_to_wall(breakdown, 42.0)
    assert breakdown.seconds["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] == 5.0  # 5..10; none from 40 to 30


def test_the_report_keys_are_the_contracts_and_the_shares_sum_to_one():
    report = account([_attempt(0.0, init=1.0, ready=2.0, start_step=0, steps=[(1, 2, 10.0, 6.0, 1.0)])]).report()
    assert set(report) == {contract.GOODPUT_KEY, *contract.BADPUT_KEYS.values()}
    assert sum(report.values()) == pytest.approx(1.0) and report["goodput"] == pytest.approx(0.6)


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now

    def tick(self, seconds):
        self.now += seconds


def test_the_event_log_writes_what_the_accounting_reads_and_its_live_view_agrees(tmp_path):
    clock = _Clock()
    earlier = tmp_path / EVENTS_DIR / "events-19700101T000000.000000Z-1.jsonl"
    earlier.parent.mkdir()
    earlier.write_text("".join(json.dumps(e) + "\n" for e in _attempt(900.0, init=901.0, ready=902.0, start_step=0,
                                                                      steps=[(1, 4, 950.0, 40.0, 0.0)]))
                       + '{"event": "steps", "ti')  # a line a kill tore
    with EventLog(started=990.0, clock=clock) as log:
        log.open(tmp_path, is_main=True)
        log.mark("init")
        with log.span("restore") as restored:
            clock.tick(2)
            restored["step"] = 2
        log.mark("ready", start_step=2)
        for number in (3, 4, 5):
            waited = clock()
            clock.tick(0.5)
            began = clock()
            clock.tick(1)
            log.step(number, waited=waited, began=began)
            if number == 4:
                log.flush()
                with log.span("save", step=4):
                    clock.tick(1)
        live = goodput_accounting.account(log.attempts())
        # The live view sums the loop's recurring events: one steps record, however long the run.
        assert [(e["first"], e["last"]) for e in log.attempts()[-1] if e["event"] == "steps"] == [(3, 5)]
    written = read_attempts(tmp_path / EVENTS_DIR)
    assert written[1][-1]["status"] == "done"
    assert [len(events) for events in written] == [4, 8]  # the torn line skipped; steps 3-4 and 5 two records
    final = goodput_accounting.account(written)
    assert final.seconds == pytest.approx(live.seconds)  # `end` adds no time: the clock stood still
    assert final.seconds[PRODUCTIVE] == pytest.approx(3.0 + 2 * 10.0)  # 3..4 of the first attempt were lost
    assert final.seconds["WASTED_PROGRESS_FROM_DISRUPTION"] == pytest.approx(20.0)
    assert final.seconds["DATA_LOADING_SYNC"] == pytest.approx(1.5)
    _sums_to_wall(final, clock() - 900.0)


def test_the_last_event_says_how_the_attempt_ended(tmp_path):
    with pytest.raises(KeyboardInterrupt), EventLog(started=0.0) as log:
        log.open(tmp_path, is_main=True)
        raise KeyboardInterrupt
    (events,) = read_attempts(tmp_path / EVENTS_DIR)
    assert events[-1]["event"] == "end" and events[-1]["status"] == "KeyboardInterrupt"


def test_a_process_other_than_the_first_writes_nothing_and_a_failed_write_warns_once(tmp_path, capsys):
    with EventLog(started=0.0) as log:
        log.open(tmp_path, is_main=False)
        log.mark("init")
    assert not (tmp_path / EVENTS_DIR).exists() and log.attempts() == []
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the run directory's goodput folder would go")
    with EventLog(started=0.0) as log:
        log.open(blocked, is_main=True)
        log.mark("init")
        log.mark("ready", start_step=0)
    assert capsys.readouterr().err.count("warning") == 1


def test_the_cli_prints_the_table_and_names_a_workdir_without_events(tmp_path, capsys):
    run = tmp_path / "run"
    (run / EVENTS_DIR).mkdir(parents=True)
    (run / EVENTS_DIR / "events-1.jsonl").write_text("".join(
        json.dumps(e) + "\n" for e in _attempt(0.0, init=1.0, ready=2.0, start_step=0, steps=[(1, 5, 10.0, 6.0, 0.0)], end=10.0)))
    assert main([str(run)]) == contract.OK
    table = capsys.readouterr().out
    assert "goodput of" in table and "60.0%" in table and "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION" in table
    assert run_breakdown(str(run)).wall_s == 10.0
    assert main([str(tmp_path / "nothing")]) == contract.USER_ERROR
    assert capsys.readouterr().err.strip() == (f"trainer.goodput_report: error: {tmp_path / 'nothing'}: no goodput events there "
                                               f"(no {EVENTS_DIR}/events-*.jsonl); pass the --workdir of a `python -m trainer` run")


def assert_accounts_for_the_wall_time(workdir, *, attempts: int) -> goodput_accounting.Breakdown:
    """The goodput table of a real run, printed (pytest -s shows it), its categories summing to the
    wall time the raw events span: the first start to the last event."""
    events = read_attempts(workdir / EVENTS_DIR)
    breakdown = goodput_accounting.account(events)
    print(goodput_accounting.format_table(breakdown, title=f"goodput of {workdir}: {breakdown.goodput:.1%}"))
    first_start = min(event["time"] for attempt in events for event in attempt if event["event"] == "start")
    wall = max(event["time"] for attempt in events for event in attempt) - first_start
    assert breakdown.attempts == attempts
    assert math.isclose(breakdown.wall_s, wall, rel_tol=0.01), (breakdown.wall_s, wall)
    assert breakdown.seconds[PRODUCTIVE] > 0 and breakdown.seconds["PROGRAM_STARTUP"] > 0
    return breakdown


def test_unreadable_event_lines_are_left_out_with_one_warning_a_file_and_the_rest_is_accounted(tmp_path, capsys):
    """A byte that is not UTF-8 stopped a run at start and the CLI with a UnicodeDecodeError; a steps event
    without `last` crashed a resumed run at its first report (KeyError), a span without `seconds` and a ready
    without `start_step` traced back in the CLI. Each is a line left out, said once for the file."""
    folder = tmp_path / EVENTS_DIR
    folder.mkdir()
    good = _attempt(100.0, init=110.0, ready=130.0, start_step=0, compile_s=8.0, steps=[(1, 10, 150.0, 15.0, 2.0)], end=160.0)
    bad = [b'\xff{"event": "eval", "time": 155.0, "seconds": 1.0}',
           json.dumps({"event": "steps", "first": 11, "time": 156.0, "seconds": 1.0, "data_seconds": 0.0}).encode(),
           json.dumps({"event": "compile", "time": 131.0}).encode(),
           json.dumps({"event": "ready", "time": 132.0}).encode(),
           json.dumps({"event": "save", "time": 157.0, "seconds": "2"}).encode()]
    (folder / "events-0001.jsonl").write_bytes(b"\n".join([json.dumps(event).encode() for event in good] + bad) + b"\n")
    warnings = []
    (events,) = read_attempts(folder, warn=warnings.append)
    assert events == good
    assert warnings == [f"{folder / 'events-0001.jsonl'}: 5 goodput event lines unreadable (not JSON, not UTF-8, or a "
                        "field missing), left out of the accounting"]
    _sums_to_wall(account([events]), 60.0)
    # The CLI prints the table, the warning once on stderr
    assert main([str(tmp_path)]) == contract.OK
    captured = capsys.readouterr()
    assert "goodput of" in captured.out and captured.err.count("5 goodput event lines unreadable") == 1


def test_a_step_is_lost_if_any_later_attempt_resumed_before_it_and_the_cli_reads_every_attempt(tmp_path, capsys):
    """Three attempts: the second resumed after step 20 (the local tier) and was killed too; the third
    resumed after step 10 (the persistent tier, the local one gone with its pods). The first attempt's steps
    11..30 were all computed again: the earliest later resume decides, not the latest."""
    first = _attempt(100.0, init=101.0, ready=102.0, start_step=0,
                     steps=[(1, 10, 112.0, 10.0, 0.0), (11, 20, 122.0, 10.0, 0.0), (21, 30, 132.0, 10.0, 0.0)])
    second = _attempt(140.0, init=141.0, ready=142.0, start_step=20, steps=[(21, 25, 147.0, 5.0, 0.0)])
    third = _attempt(150.0, init=151.0, ready=152.0, start_step=10, steps=[(11, 40, 182.0, 30.0, 0.0)], end=182.0)
    breakdown = account([first, second, third])
    _sums_to_wall(breakdown, 82.0)
    assert breakdown.seconds["WASTED_PROGRESS_FROM_DISRUPTION"] == 20.0 + 5.0  # the first's 11..30, the second's 21..25
    assert breakdown.seconds[PRODUCTIVE] == 10.0 + 30.0
    run = tmp_path / "run"
    (run / EVENTS_DIR).mkdir(parents=True)
    for number, attempt in enumerate((first, second, third), 1):
        (run / EVENTS_DIR / f"events-{number}.jsonl").write_text("".join(json.dumps(event) + "\n" for event in attempt))
    assert main([str(run)]) == contract.OK
    assert f"goodput of {run}: {breakdown.goodput:.1%} over 3 attempts" in capsys.readouterr().out


# An attempt with a log interval of 5 on a clock of one second a step (step k ends at 2 + k), which says
# each step it has done on stdout and waits to be killed.
_KILLED_ATTEMPT = """
import pathlib, sys, time
from trainer.measure.run_events import EventLog
now = [0.0]
log = EventLog(started=0.0, clock=lambda: now[0])
log.open(pathlib.Path(sys.argv[1]), is_main=True)
now[0] = 1.0
log.mark("init")
now[0] = 2.0
log.mark("ready", start_step=0)
for number in range(1, 8):
    began = now[0]
    now[0] += 1.0
    log.step(number, waited=began, began=began)
    if number % 5 == 0:
        log.flush()
    print(number, flush=True)
time.sleep(600)
"""


def test_a_sigkill_loses_the_steps_after_the_last_report_as_wasted_progress_and_they_count_to_the_last_step(tmp_path):
    """Killed after step 7, its last flush at step 5, and resumed from the checkpoint of step 5: steps 6 and
    7 were computed again (wasted, 2 s), and the attempt counts to step 7's end (9 s), not to its last flush
    (booking 6 and 7 as infrastructure recovery, and cutting a killed last attempt short)."""
    killed = subprocess.Popen([sys.executable, "-c", _KILLED_ATTEMPT, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              cwd=pathlib.Path(__file__).parents[3])
    try:
        assert [killed.stdout.readline().strip() for _ in range(7)][-1] == "7"
    finally:
        killed.kill()
    assert killed.wait() == -signal.SIGKILL
    (events,) = read_attempts(tmp_path / EVENTS_DIR, warn=pytest.fail)
    assert account([events]).wall_s == 9.0
    resumed = _attempt(20.0, init=21.0, ready=22.0, start_step=5, steps=[(6, 10, 27.0, 5.0, 0.0)], end=27.0)
    breakdown = account([events, resumed])
    _sums_to_wall(breakdown, 27.0)
    assert breakdown.seconds["WASTED_PROGRESS_FROM_DISRUPTION"] == 2.0
    assert breakdown.seconds["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] == 20.0 - 9.0
    assert breakdown.seconds[PRODUCTIVE] == 5.0 + 5.0


def test_attempts_of_another_run_in_the_folder_are_left_out_with_one_warning(tmp_path):
    """Each attempt's start names its run (trainer.run_identity); a folder holding another run's events
    (copied in, or a workdir reused) counted them as this run's attempts."""
    with EventLog(started=0.0, clock=lambda: 5.0) as log:
        log.open(tmp_path, is_main=True, run="train-0123abcd")
    (tmp_path / EVENTS_DIR / "events-0-other.jsonl").write_text(
        json.dumps({"event": "start", "time": 1.0, "run": "train-89abcdef"}) + "\n")
    (tmp_path / EVENTS_DIR / "events-1-older.jsonl").write_text(json.dumps({"event": "start", "time": 2.0}) + "\n")
    warnings = []
    attempts = read_attempts(tmp_path / EVENTS_DIR, run="train-0123abcd", warn=warnings.append)
    assert [events[0].get("run") for events in attempts] == [None, "train-0123abcd"]  # one from before runs had names
    assert warnings == [f"{tmp_path / EVENTS_DIR / 'events-0-other.jsonl'}: the goodput events of run train-89abcdef, not of "
                        "this folder's run train-0123abcd; left out of the accounting"]
