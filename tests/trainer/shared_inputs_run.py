"""`python -m tests.trainer.shared_inputs_run RECORD.json ROUNDS BASE_DIR TRAINER_ARGS...`: one process of a
job whose processes resolve their inputs (`trainer.loop.resolve_inputs`, as `python -m trainer` does at
start) in the same fresh workdir at the same instant, ROUNDS times (BASE_DIR/round-R).

The processes meet at a barrier of JAX's distributed runtime before each round, so that they enter
the trainer's own code together, as the pods of a multi-host slice do. RECORD.json gets, per round,
the tokenizer's digest and the number of documents this process saw, or the error it raised.
"""

import dataclasses
import json
import pathlib
import sys

from jax._src import distributed  # the runtime client: a barrier that is not a device collective

from trainer import loop
from trainer.config import parse_config
from trainer.errors import first_line
from trainer.run import mesh

START_TIMEOUT_MS = 120_000


def main(record_path: str, rounds: int, base_dir: str, trainer_args: list[str]) -> int:
    config = parse_config(trainer_args)
    mesh.initialize_distributed(coordinator_address=config.coordinator_address, num_processes=config.num_processes,
                                process_id=config.process_id)  # fmt: skip
    record = []
    for round_index in range(rounds):
        workdir = pathlib.Path(base_dir) / f"round-{round_index}"
        workdir.mkdir(parents=True, exist_ok=True)
        distributed.global_state.client.wait_at_barrier(f"round-{round_index}", START_TIMEOUT_MS)
        try:
            inputs = loop.resolve_inputs(dataclasses.replace(config, workdir=str(workdir)), workdir)
        except Exception as error:  # noqa: BLE001 - the record says what each process met
            record.append({"error": f"{type(error).__name__}: {first_line(error)}"})
            continue
        record.append({"tokenizer": inputs.tokenizer.sha256, "documents": int(inputs.data.documents)})
    pathlib.Path(record_path).write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]))
