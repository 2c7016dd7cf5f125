"""`python -m trainer.supervise [--restarts N] [--pause S] -- COMMAND...`: run the trainer as a child
process and restart it in place, inside the same pod, when it crashes.

Why: the local checkpoint tier (trainer.run.local_checkpoints) lives in the pod's memory-backed
emptyDir, and the workloads restart a failed run by recreating every pod (restartPolicy Never), which
loses it. A trainer process that crashes while its pod goes on (killed by a signal such as the kernel's
OOM killer, a runtime error) is restarted here instead, so the restart reads the local tier.

What ends the child, and what follows:
- SIGTERM or SIGINT to the supervisor (a preemption, the pod deleted): forwarded to the child, which
  checkpoints and exits; the supervisor exits with the child's code and restarts nothing (the pod ends).
- OK: the run is done. USER_ERROR: retrying cannot help. RETRY: the trainer saved after a preemption
  notice and asks the workload to restart it; without a SIGTERM here it means a peer of a multi-host
  job was told to stop (JAX's preemption sync point stops every process at the same step), so the
  whole job is going down and is restarted by the JobSet. None of these is restarted in place.
- Anything else (a signal, any other code): restarted after a pause, at most N times, one line on
  stderr each. After N the supervisor exits with the child's code and the Job/JobSet's failure rules
  apply as without it. A child killed by signal S reports 128+S, as a shell would.

The restart budget counts the crashes of the last --restart-window seconds: a run that crashes once a day
for a week is restarted each time, one that crashes N+1 times within the window is not.

The child runs in a process group of its own. When it ends, whatever it left running in that group (data
loader workers, a subprocess) is killed before the next start, so that no orphan of a crashed trainer keeps
its memory. The supervisor is the container's first process, to which orphans fall: it reaps every child
that ends while it waits for the trainer, not only between attempts, so none stays a zombie.

Multi-host: every pod runs its own supervisor around its own trainer process. A crashed process makes
its peers fail too: JAX's distributed runtime ends a process whose coordinator or peer stopped
answering (its heartbeats), and their supervisors restart them as well. Each restarted trainer calls
jax.distributed.initialize() as on the first start and meets the others at the same coordinator (the
pod of process 0, which keeps its name and address while the pods live), then the job agrees on the
newest step every process holds (the local tier, else the persistent one). A peer that never comes
back leaves the others failing their rendezvous until their restarts are spent; then the JobSet
restarts the pods.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import signal
import subprocess
import sys
import time

from trainer import contract
from trainer.config import non_negative_float, non_negative_int
from trainer.errors import OneLineParser, UserError, entry_point

DEFAULT_RESTARTS = 3
DEFAULT_PAUSE_S = 5.0
MAX_PAUSE_S = 24 * 3600.0  # time.sleep refuses about 1e10 s (after the crash, a traceback); a day is plenty
DEFAULT_RESTART_WINDOW_S = 3600.0
_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
_FORWARDED = (signal.SIGTERM, signal.SIGINT)
# Exits a restart in place cannot help, or that the workload must see (module docstring).
_NOT_RESTARTED = (contract.OK, contract.USER_ERROR, contract.RETRY)


def exit_code(returncode: int) -> int:
    """A Popen return code as a process exit code: a child killed by signal S (-S) is 128+S."""
    return 128 - returncode if returncode < 0 else returncode


def end_leftovers(group: int) -> None:
    """Kill what is left of the child's process group `group`, and reap every child of ours that has ended."""
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:  # nothing was left
        pass
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:  # no children at all
            return
        if pid == 0:  # children, none ended
            return


def become_subreaper() -> None:
    """Orphans of the trainer's processes fall to this process even when it is not the container's first one
    (Linux's PR_SET_CHILD_SUBREAPER); elsewhere nothing changes."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def wait_reaping(child: subprocess.Popen) -> int:
    """`child`'s return code, reaping every other child of ours that ends meanwhile (orphans that fell to us)."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:  # no child left to wait for: `child` was reaped already
            return child.wait()
        if pid == child.pid:
            child.returncode = os.waitstatus_to_exitcode(status)
            return child.returncode


def what_ended(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with code {returncode}"


class Supervisor:
    """Runs `command` until it ends in a way a restart cannot help, or `restarts` restarts are spent."""

    def __init__(self, command: list[str], *, restarts: int, pause_s: float, window_s: float = DEFAULT_RESTART_WINDOW_S,
                 clock=time.monotonic):
        self.command, self.restarts, self.pause_s, self.window_s, self._clock = command, restarts, pause_s, window_s, clock
        self._child: subprocess.Popen | None = None
        self._stopping: signal.Signals | None = None

    def _forward(self, signum, frame) -> None:
        self._stopping = signal.Signals(signum)
        # Not Popen.poll() or send_signal() (which polls): it would reap the child under the waiting loop.
        if self._child is not None and self._child.returncode is None:
            os.kill(self._child.pid, signum)

    def _start(self) -> subprocess.Popen:
        try:
            return subprocess.Popen(self.command, process_group=0)
        except OSError as error:
            raise UserError(f"cannot start {self.command[0]}: {error.strerror or error}") from None

    def run(self) -> int:
        for forwarded in _FORWARDED:
            signal.signal(forwarded, self._forward)
        become_subreaper()
        crashes = collections.deque()  # when the crashes of the last window_s seconds happened
        while True:
            self._child = self._start()
            if self._stopping is not None:  # the signal came while the child was being started
                os.kill(self._child.pid, self._stopping)
            returncode = wait_reaping(self._child)
            end_leftovers(self._child.pid)
            now = self._clock()
            while crashes and crashes[0] <= now - self.window_s:
                crashes.popleft()
            if self._stopping is not None or returncode in _NOT_RESTARTED or len(crashes) == self.restarts:
                return exit_code(returncode)
            crashes.append(now)
            print(f"trainer.supervise: the trainer {what_ended(returncode)}; restarting it in this pod, "
                  f"attempt {len(crashes)} of {self.restarts} within {self.window_s:g} s", file=sys.stderr, flush=True)
            time.sleep(self.pause_s)
            if self._stopping is not None:  # told to stop during the pause: no new child
                return exit_code(returncode)


def _pause(text: str) -> float:
    seconds = non_negative_float(text)
    if seconds > MAX_PAUSE_S:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_PAUSE_S:g} seconds, got {text!r}")
    return seconds


@entry_point(prefix="trainer.supervise: ")
def main(argv=None) -> int:
    parser = OneLineParser(prog="python -m trainer.supervise", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--restarts", type=non_negative_int, default=DEFAULT_RESTARTS,
                        help=f"restarts in place within --restart-window before the child's code is the supervisor's "
                             f"(default {DEFAULT_RESTARTS})")
    parser.add_argument("--restart-window", type=non_negative_float, default=DEFAULT_RESTART_WINDOW_S,
                        help=f"seconds a crash counts against --restarts (default {DEFAULT_RESTART_WINDOW_S:g})")
    parser.add_argument("--pause", type=_pause, default=DEFAULT_PAUSE_S,
                        help=f"seconds between a crash and the restart (default {DEFAULT_PAUSE_S:g})")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the trainer's command line")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    return Supervisor(command, restarts=args.restarts, pause_s=args.pause, window_s=args.restart_window).run()


if __name__ == "__main__":
    sys.exit(main())
