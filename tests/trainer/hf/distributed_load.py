"""`python -m tests.trainer.hf.distributed_load RECORD.json HF_DIR VOCAB PORT PROCESSES INDEX`: one process of
a CPU job that reads a Hugging Face directory (of tests/trainer/hf/test_export.rich_config(VOCAB)) into FSDP
shardings over every device, as the trainer does, and writes to RECORD.json the bytes it read, the
directory's tensor bytes, and whether each of its shards holds the directory's values there."""

import json
import pathlib
import sys

import jax
import numpy as np
from safetensors.numpy import load_file

from tests.trainer.hf.test_export import rich_config
from trainer.model import models
from trainer.run import mesh
from trainer.hf import load as hf_load, weights as hf_weights


def main(record_path: str, directory: str, vocab: int, port: int, processes: int, index: int) -> None:
    mesh.initialize_distributed(coordinator_address=f"localhost:{port}", num_processes=processes, process_id=index)
    config = rich_config(vocab)
    device_mesh = mesh.build_mesh({"data": 1, "fsdp": -1})
    expected = jax.eval_shape(lambda: models.init_params(config, seed=0))
    found = hf_load.ModelDirectory(directory)
    params = found.load(config, expected, mesh.state_shardings(device_mesh, expected))
    stored = {}
    for file in pathlib.Path(directory).glob("*.safetensors"):
        stored.update(load_file(file))
    whole = {}
    for tensor in hf_weights.model_tensors(config):
        shape = hf_weights.lookup(expected, tensor.source).shape
        value = tensor.layout.from_hf(stored[tensor.name].astype(np.float32), tensor.part_shape(shape))
        whole.setdefault(tensor.source, []).append(value)
    matches = all(
        np.array_equal(np.asarray(shard.data), (np.stack(whole[source], axis=0) if len(whole[source]) > 1 else whole[source][0])[shard.index])
        for source, array in ((tuple(k.key for k in path), leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0])
        for shard in array.addressable_shards
    )
    split = sum(1 for leaf in jax.tree.leaves(params) if not leaf.sharding.is_fully_replicated)
    pathlib.Path(record_path).write_text(json.dumps({
        "bytes_read": found.tensors.bytes_read, "bytes": sum(v.nbytes for v in stored.values()),
        "matches": matches, "split_arrays": split, "devices": jax.device_count()}))
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:]))
