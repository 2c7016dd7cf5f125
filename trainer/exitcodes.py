"""Exit codes the trainer promises; the workloads' failure policy is built from them."""

OK = 0
# A user error (bad flag, config or data file): retrying cannot help, so the run fails at once.
USER_ERROR = 2
# The trainer checkpointed after a preemption notice (SIGTERM) and asks to be restarted.
# 75 is EX_TEMPFAIL from sysexits.h: "temporary failure, try again".
RETRY = 75
