"""The container's contract with the workloads that run it: its exit codes, the image's user and
the prepared-data marker. No heavy imports: the workload builders and the image build read it."""

OK = 0
# A user error (bad flag, config or data file): retrying cannot help, so the run fails at once.
USER_ERROR = 2
# The trainer checkpointed after a preemption notice (SIGTERM) and asks to be restarted.
# 75 is EX_TEMPFAIL from sysexits.h: "temporary failure, try again".
RETRY = 75

# The image's non-root user (trainer/Dockerfile takes it as a build argument from infra/image.py).
TRAINER_UID = 1000
# `python -m trainer.prepare` writes this file last inside its output and renames the output into
# place: its presence means the prepared data is complete.
PREPARED_MARKER_FILE = "meta.json"
