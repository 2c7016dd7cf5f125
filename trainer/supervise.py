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

The child runs in a process group of its own. When it ends, whatever it left running in that group (data
loader workers, a subprocess) is killed before the next start, so that no orphan of a crashed trainer keeps
its memory, and the supervisor (the container's first process, to which orphans fall) reaps what ended.

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
import os
import signal
import subprocess
import sys
import time

from trainer import contract

DEFAULT_RESTARTS = 3
DEFAULT_PAUSE_S = 5.0
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


def what_ended(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with code {returncode}"


class Supervisor:
    """Runs `command` until it ends in a way a restart cannot help, or `restarts` restarts are spent."""

    def __init__(self, command: list[str], *, restarts: int, pause_s: float):
        self.command, self.restarts, self.pause_s = command, restarts, pause_s
        self._child: subprocess.Popen | None = None
        self._stopping: signal.Signals | None = None

    def _forward(self, signum, frame) -> None:
        self._stopping = signal.Signals(signum)
        if self._child is not None and self._child.poll() is None:
            self._child.send_signal(signum)

    def run(self) -> int:
        for forwarded in _FORWARDED:
            signal.signal(forwarded, self._forward)
        attempt = 0
        while True:
            self._child = subprocess.Popen(self.command, process_group=0)
            if self._stopping is not None:  # the signal came while the child was being started
                self._child.send_signal(self._stopping)
            returncode = self._child.wait()
            end_leftovers(self._child.pid)
            if self._stopping is not None or returncode in _NOT_RESTARTED or attempt == self.restarts:
                return exit_code(returncode)
            attempt += 1
            print(f"trainer.supervise: the trainer {what_ended(returncode)}; restarting it in this pod, "
                  f"attempt {attempt} of {self.restarts}", file=sys.stderr, flush=True)
            time.sleep(self.pause_s)
            if self._stopping is not None:  # told to stop during the pause: no new child
                return exit_code(returncode)


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.supervise", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--restarts", type=_non_negative_int, default=DEFAULT_RESTARTS,
                        help=f"restarts in place before the child's code is the supervisor's (default {DEFAULT_RESTARTS})")
    parser.add_argument("--pause", type=float, default=DEFAULT_PAUSE_S,
                        help=f"seconds between a crash and the restart (default {DEFAULT_PAUSE_S:g})")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the trainer's command line")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    return Supervisor(command, restarts=args.restarts, pause_s=args.pause).run()


if __name__ == "__main__":
    sys.exit(main())
