"""`python -m trainer`: fine-tune; exits 0 when done, contract.RETRY after a preemption checkpoint,
contract.USER_ERROR with one line on stderr for a problem the user can fix."""

import os
import sys

from trainer import contract
from trainer.errors import UserError, entry_point, first_line
from trainer.measure.run_events import process_start_time


@entry_point(prefix="trainer: ")
def main(argv=None, *, started: float | None = None) -> int | None:
    """`started`: when the process started, the first goodput event (trainer.measure.run_events)."""
    from trainer.config import parse_config

    config = parse_config(argv)
    # XLA's C++ logging (jaxlib's TSL, libtpu) prints start-up notices below warnings to stderr: hidden.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import jax  # JAX loads only once the flags are known to be good

    from trainer import loop

    try:
        loop.train(config, started=started)
    except loop.Preempted as preempted:
        print(f"trainer: {preempted}", file=sys.stderr)
        return contract.RETRY
    except jax.errors.JaxRuntimeError as error:
        from trainer.run import compile_answers, hbm

        if not compile_answers.out_of_memory(error):
            raise
        raise UserError(f"out of device memory ({first_line(error)}); "
                        f"{hbm.advice(config, jax.device_count())}") from None


if __name__ == "__main__":
    sys.exit(main(started=process_start_time()))
