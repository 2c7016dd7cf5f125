"""The loader: packed rows that never mix documents, a fixed order for a seed, per-process shares
that add up to the global batch, and an iterator state that resumes at exactly the next batch."""

import collections
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from etils import epath

import grain
from trainer.data import prepare as prepare_lib
from trainer.data.loader import batches, open_data, steps_per_epoch
from trainer.errors import UserError

SEQ_LEN = 256


def _take(iterator, count):
    return [next(iterator) for _ in range(count)]


def _assert_same(left, right):
    assert len(left) == len(right)
    for a, b in zip(left, right):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def _segments(batch_list):
    """Every packed segment as the token sequence it covers (its inputs plus its last target)."""
    found = []
    for batch in batch_list:
        for row in range(batch["segment_ids"].shape[0]):
            ids = batch["segment_ids"][row]
            for segment in np.unique(ids[ids > 0]):
                where = np.flatnonzero(ids == segment)
                found.append(tuple(batch["input_tokens"][row, where]) + (batch["target_tokens"][row, where[-1]],))
    return found


def _expected_windows(data, seq_len, bos_id, documents=None):
    source = data.source()
    windows = []
    for document in range(data.documents) if documents is None else documents:
        tokens = (bos_id,) + tuple(np.frombuffer(source[document], dtype=prepare_lib.TOKEN_DTYPE))
        windows += [tokens[start:start + seq_len + 1] for start in range(0, len(tokens) - 1, seq_len)]
    return windows


def test_rows_are_packed_full(tokenized_data):
    packed = np.mean([b["loss_mask"].mean() for b in _take(batches(tokenized_data, seq_len=SEQ_LEN,
                      global_batch_size=2, seed=0), 100)])
    one_per_row = np.mean([b["loss_mask"].mean() for b in _take(batches(tokenized_data, seq_len=SEQ_LEN,
                           global_batch_size=2, seed=0, packing_bins=1), 100)])
    print(f"packing fill at seq {SEQ_LEN}: {packed:.1%} of positions (one open row: {one_per_row:.1%})")
    assert packed >= 0.95
    assert one_per_row < 0.85


@pytest.mark.parametrize("seq_len", [SEQ_LEN, 64])
def test_one_pass_holds_every_window_once_and_masks_only_real_next_tokens(tokenized_data, seq_len):
    """Reassembling the segments of a pass gives back each document's windows exactly once, so no
    segment crosses a document boundary and every unmasked target is its document's next token."""
    bos_id = tokenized_data.meta["tokenizer"]["bos_id"]
    passed = list(batches(tokenized_data, seq_len=seq_len, global_batch_size=4, seed=0, epochs=1))
    assert collections.Counter(_segments(passed)) == collections.Counter(_expected_windows(tokenized_data, seq_len, bos_id))
    for batch in passed:
        segment_ids, positions = batch["segment_ids"], batch["positions"]
        assert batch["input_tokens"].shape == (4, seq_len)
        assert {k: v.dtype for k, v in batch.items()} == {
            "input_tokens": np.int32, "target_tokens": np.int32, "segment_ids": np.int32, "positions": np.int32,
            "loss_mask": np.float32}
        np.testing.assert_array_equal(batch["loss_mask"], segment_ids > 0)
        np.testing.assert_array_equal(batch["input_tokens"][segment_ids == 0], 0)
        # Positions restart at 0 where a segment starts and count up inside it.
        starts = np.diff(segment_ids, axis=1, prepend=0) != 0
        np.testing.assert_array_equal(positions[starts & (segment_ids > 0)], 0)
        continuing = ~starts & (segment_ids > 0)
        np.testing.assert_array_equal(positions[:, 1:][continuing[:, 1:]],
                                      positions[:, :-1][continuing[:, 1:]] + 1)


def test_same_seed_same_batches_other_seed_other_batches(tokenized_data):
    def first(seed):
        return _take(batches(tokenized_data, seq_len=SEQ_LEN, global_batch_size=4, seed=seed), 3)

    _assert_same(first(1), first(1))
    assert not np.array_equal(first(1)[0]["input_tokens"], first(2)[0]["input_tokens"])


def test_each_epoch_is_reshuffled(tokenized_data):
    bos_id = tokenized_data.meta["tokenizer"]["bos_id"]
    two_epochs = batches(tokenized_data, seq_len=SEQ_LEN, global_batch_size=1, seed=0, epochs=2)
    document_starts = [s for s in _segments(two_epochs) if s[0] == bos_id]
    documents = tokenized_data.documents
    assert len(document_starts) == 2 * documents and set(collections.Counter(document_starts).values()) == {2}
    first, second = document_starts[:documents], document_starts[documents:]
    assert len(set(first[:50]) & set(second[:50])) < 25  # another order, not the same one again


def test_unbounded_epochs_keep_going(tokenized_data):
    steps = steps_per_epoch(tokenized_data, seq_len=SEQ_LEN, global_batch_size=2)
    forever = batches(tokenized_data, seq_len=SEQ_LEN, global_batch_size=2, seed=0)
    assert all(batch["loss_mask"].any() for batch in _take(forever, 3 * steps))


def test_process_shares_add_up_to_the_global_batch_row_for_row(tokenized_data):
    common = dict(seq_len=SEQ_LEN, global_batch_size=4, seed=5, epochs=1)
    whole = list(batches(tokenized_data, **common))
    shares = [list(batches(tokenized_data, **common, process_index=p, process_count=2)) for p in range(2)]
    assert len(shares[0]) == len(shares[1]) == len(whole) == steps_per_epoch(tokenized_data, seq_len=SEQ_LEN,
                                                                             global_batch_size=4)
    for step, batch in enumerate(whole):
        for key in batch:
            assert shares[0][step][key].shape[0] == 2
            np.testing.assert_array_equal(np.concatenate([shares[0][step][key], shares[1][step][key]]), batch[key])


@pytest.mark.parametrize("seed, epochs", [(0, 1), (3, 2)])
def test_a_finite_pass_has_the_planned_number_of_batches_for_any_seed(tokenized_data, seed, epochs):
    steps = steps_per_epoch(tokenized_data, seq_len=SEQ_LEN, global_batch_size=4, eval_fraction=0.1)
    passed = list(batches(tokenized_data, seq_len=SEQ_LEN, global_batch_size=4, seed=seed, eval_fraction=0.1,
                          epochs=epochs))
    assert len(passed) == epochs * steps


def test_restored_state_continues_with_exactly_the_next_batch(tmp_path, tokenized_data):
    common = dict(seq_len=SEQ_LEN, global_batch_size=2)
    steps = steps_per_epoch(tokenized_data, **common)
    common["seed"] = 0
    iterator = batches(tokenized_data, **common)
    _take(iterator, steps - 3)  # the saved position is close to an epoch boundary
    state = iterator.get_state()
    grain.checkpoint.CheckpointHandler().save(epath.Path(tmp_path), args=grain.checkpoint.CheckpointSave(iterator))
    expected = _take(iterator, 6)

    restored = batches(tokenized_data, **common)
    restored.set_state(state)
    _assert_same(_take(restored, 6), expected)
    from_checkpoint = grain.checkpoint.CheckpointHandler().restore(
        epath.Path(tmp_path), args=grain.checkpoint.CheckpointRestore(batches(tokenized_data, **common)))
    _assert_same(_take(from_checkpoint, 6), expected)


def test_eval_split_is_held_out_deterministic_and_finite(tokenized_data):
    def segments(split, seed):
        return _segments(batches(tokenized_data, seq_len=SEQ_LEN, global_batch_size=4, seed=seed, split=split,
                                 eval_fraction=0.1, epochs=1))

    eval_segments, train_segments = segments("eval", 0), segments("train", 0)
    assert eval_segments == segments("eval", 7)  # the same held-out documents whatever the training seed
    assert not set(eval_segments) & set(train_segments)
    assert len(eval_segments) + len(train_segments) == len(_expected_windows(tokenized_data, SEQ_LEN, 2))


def test_raw_text_is_prepared_once_into_the_cache(tmp_path, corpus_path, tokenizer, tokenized_data):
    first = open_data(str(corpus_path), tokenizer=tokenizer, cache_dir=str(tmp_path))
    again = open_data(str(corpus_path), tokenizer=tokenizer, cache_dir=str(tmp_path))
    assert first.path == again.path and [p.name for p in tmp_path.iterdir()] == [first.path.split("/")[-1]]
    assert (first.documents, first.tokens) == (tokenized_data.documents, tokenized_data.tokens)


def test_bad_loader_settings_are_clear_errors(tmp_path, tokenized_data, tokenizer):
    with pytest.raises(UserError, match="not divisible by the 3 processes"):
        batches(tokenized_data, seq_len=SEQ_LEN, global_batch_size=4, seed=0, process_count=3)
    with pytest.raises(UserError, match="training documents cannot fill 100000 batch rows"):
        batches(tokenized_data, seq_len=SEQ_LEN, global_batch_size=100_000, seed=0)
    with pytest.raises(UserError, match="selects none"):
        batches(tokenized_data, seq_len=SEQ_LEN, global_batch_size=4, seed=0, eval_fraction=1e-6)
    with pytest.raises(UserError, match="missing: not found"):
        open_data(str(tmp_path / "missing"), tokenizer=tokenizer, cache_dir=str(tmp_path))


def test_exit_code_survives_a_busy_prefetch_thread(tokenized_data, tokenizer_path):
    """The trainer's exit code (75 = retry me) must reach the workload even when the process exits
    while the prefetch thread is reading, and shutdown must print nothing."""
    script = (
        "import sys\n"
        "from trainer.data.loader import open_data, batches\n"
        "from trainer.data.tokenizer import load_tokenizer\n"
        f"data = open_data({tokenized_data.path!r}, tokenizer=load_tokenizer({str(tokenizer_path)!r}), cache_dir='unused')\n"
        "iterator = batches(data, seq_len=64, global_batch_size=128, seed=0)\n"
        "next(iterator)\n"
        "sys.exit(75)\n"
    )
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              cwd=pathlib.Path(__file__).parents[3])
    assert finished.returncode == 75, finished.stderr
    assert "Exception" not in finished.stderr and "terminate" not in finished.stderr
