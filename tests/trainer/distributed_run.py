"""`python -m tests.trainer.distributed_run RECORD.json TRAINER_ARGS...`: the real trainer CLI, plus a record.

The distributed tests launch this in each local process. It runs `trainer.__main__.main` unchanged
and writes to RECORD.json what that process saw: the job's devices, the mesh (which process holds
each device) and the rows of every batch it fed to the train step. It exits with the trainer's code.

With KILL_AFTER_LOCAL_STEP=S in its environment, process KILL_PROCESS (default 1) SIGKILLs itself the
moment its local checkpoint of step S is complete (trainer.run.local_checkpoints, or on the multi-tier
volume: trainer.multitier.replicated): a crash at a known point, after a local save, whatever the
processes' relative speeds.
"""

import json
import os
import pathlib
import signal
import sys

import jax
from jax._src import clusters

from trainer import __main__ as cli
from trainer.multitier import replicated
from trainer.run import local_checkpoints, mesh


class StandInCluster(clusters.ClusterEnv):
    """The process count that JAX's cluster detection reads on a GKE TPU slice (TPU_WORKER_HOSTNAMES), for
    processes that join through the multi-tier stand-in's jax-init-info.txt (tests/trainer/replicator_stand_in.py),
    which names only their id and coordinator: STAND_IN_PROCESSES in the environment."""

    @classmethod
    def is_env_present(cls) -> bool:
        return "STAND_IN_PROCESSES" in os.environ

    @classmethod
    def get_process_count(cls) -> int:
        return int(os.environ["STAND_IN_PROCESSES"])

    @classmethod
    def get_local_process_id(cls) -> int | None:
        return None


def main(record_path: str, trainer_args: list[str]) -> int:
    record = {"batches": []}
    build_mesh, global_batch = mesh.build_mesh, mesh.global_batch

    def recording_build_mesh(*args, **kwargs):
        device_mesh = build_mesh(*args, **kwargs)
        record.update(
            process_index=jax.process_index(),
            process_count=jax.process_count(),
            device_count=jax.device_count(),
            local_device_count=jax.local_device_count(),
            mesh_axes=list(device_mesh.axis_names),
            mesh_processes=[[device.process_index for device in row] for row in device_mesh.devices],
        )
        return device_mesh

    def recording_global_batch(local_batch, device_mesh):
        record["batches"].append(local_batch["input_tokens"].tolist())
        return global_batch(local_batch, device_mesh)

    mesh.build_mesh, mesh.global_batch = recording_build_mesh, recording_global_batch
    kill_after = os.environ.get("KILL_AFTER_LOCAL_STEP")
    if kill_after:
        def die_after(saved, *, background: bool):
            """`saved(self, step, ...)`, then the kill once that step is complete on this host (after
            waiting for the write where `saved` leaves it to the background)."""
            def saved_then_die(self, step, *args):
                result = saved(self, step, *args)
                if step == int(kill_after) and jax.process_index() == int(os.environ.get("KILL_PROCESS", "1")):
                    if background:
                        self.wait()
                    pathlib.Path(record_path).write_text(json.dumps(record))
                    os.kill(os.getpid(), signal.SIGKILL)
                return result
            return saved_then_die

        local_checkpoints.LocalCheckpoints._write = die_after(local_checkpoints.LocalCheckpoints._write, background=False)
        replicated.ReplicatedCheckpoints.save = die_after(replicated.ReplicatedCheckpoints.save, background=True)
    try:
        return cli.main(trainer_args)
    finally:
        pathlib.Path(record_path).write_text(json.dumps(record))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
