"""Input formats of `trainer.data.prepare`: text, JSONL and Parquet rows of text, chats and prompt/response
pairs come back from the prepared records as the documents they render to; the format is detected,
stated in meta.json and can be pinned; bad rows are refused with their line or skipped and counted."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainer import contract

from trainer.data import prepare as prepare_lib
from trainer.data.corpus import SEPARATOR
from trainer.data.loader import batches, open_data
from trainer.errors import UserError
from trainer.data.prepare import main, prepare

CHATS = [
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 2 plus 2?"},
     {"role": "assistant", "content": "2 plus 2 is 4."}],
    [{"role": "user", "content": "Hello!"}, {"role": "model", "content": "Hello! How can I help you today?"},
     {"role": "user", "content": "The cup is red. What colour is the cup?"}, {"role": "model", "content": "The cup is red."}],
]
RENDERED_CHATS = [
    "<start_of_turn>user\nAnswer briefly.\n\nWhat is 2 plus 2?<end_of_turn>\n"
    "<start_of_turn>model\n2 plus 2 is 4.<end_of_turn>\n",
    "<start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\nHello! How can I help you today?<end_of_turn>\n"
    "<start_of_turn>user\nThe cup is red. What colour is the cup?<end_of_turn>\n<start_of_turn>model\nThe cup is red.<end_of_turn>\n",
]
PAIRS = [("What is 1 plus 5?", "1 plus 5 is 6."), ("Hi!", "Hello! How can I help you today?")]
RENDERED_PAIRS = [f"<start_of_turn>user\n{p}<end_of_turn>\n<start_of_turn>model\n{r}<end_of_turn>\n" for p, r in PAIRS]
TEXTS = ["Once upon a time, a cat sat.", "The end.\nA second line."]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _write(tmp_path, data_format):
    """A file of `data_format` and the documents its rows render to."""
    if data_format == "text":
        path = tmp_path / "docs.txt"
        path.write_text("".join(f"{text}\n{SEPARATOR}\n" for text in TEXTS))
        return path, TEXTS
    container, kind = data_format.split("-", 1)
    rows, rendered = {
        "text": ([{"text": text} for text in TEXTS], TEXTS),
        "chat": ([{"messages": messages} for messages in CHATS], RENDERED_CHATS),
        "prompt-response": ([{"prompt": p, "response": r} for p, r in PAIRS], RENDERED_PAIRS),
    }[kind]
    if container == "jsonl":
        return _write_jsonl(tmp_path / "rows.jsonl", rows), rendered
    path = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path, rendered


def _documents(directory, tokenizer):
    """(token ids, trained flags) of each prepared record, as the loader reads them."""
    data = open_data(str(directory), tokenizer=tokenizer, cache_dir=str(directory / "unused"))
    source = data.source()
    return [data.tokens_and_mask(i, source[i]) for i in range(len(source))]


FORMATS = ["text", "jsonl-text", "jsonl-chat", "jsonl-prompt-response", "parquet-text", "parquet-chat",
           "parquet-prompt-response"]


@pytest.mark.parametrize("data_format", FORMATS)
def test_each_format_is_detected_and_its_records_decode_to_the_rendered_documents(tmp_path, data_format,
                                                                                  chat_tokenizer):
    path, rendered = _write(tmp_path, data_format)
    meta = prepare(path, chat_tokenizer, tmp_path / "out")
    documents = _documents(tmp_path / "out", chat_tokenizer)
    assert meta["data_format"] == data_format
    assert [chat_tokenizer.decode(ids[:-1]) for ids, _ in documents] == rendered
    assert all(ids[-1] == chat_tokenizer.eos_id for ids, _ in documents)
    chat = data_format.endswith(("chat", "prompt-response"))
    assert (meta["loss_on"], meta["loss_mask"]) == (("completions", "bits-after-tokens") if chat else ("all", None))


@pytest.mark.parametrize("data_format", ["jsonl-chat", "parquet-prompt-response"])
def test_completions_train_exactly_the_model_turns_and_all_trains_every_token(tmp_path, data_format,
                                                                             chat_tokenizer):
    path, _ = _write(tmp_path, data_format)
    prepare(path, chat_tokenizer, tmp_path / "completions")
    meta_all = prepare(path, chat_tokenizer, tmp_path / "all", loss_on="all")
    completions, every = _documents(tmp_path / "completions", chat_tokenizer), _documents(tmp_path / "all", chat_tokenizer)
    answers = [[m["content"] for m in chat if m["role"] in ("model", "assistant")] for chat in CHATS] \
        if data_format == "jsonl-chat" else [[response] for _, response in PAIRS]
    for (ids, trained), expected in zip(completions, answers):
        trained_text = [chat_tokenizer.decode(ids[start:stop]) for start, stop in _true_runs(trained)]
        assert trained_text == [f"{answer}<end_of_turn>\n" for answer in expected]  # EOS trained too, decoded as ""
        assert trained[-1] == 1 and ids[-1] == chat_tokenizer.eos_id
    assert meta_all["loss_mask"] is None
    assert [ids.tolist() for ids, _ in every] == [ids.tolist() for ids, _ in completions]
    assert all(trained.all() for _, trained in every)


def _true_runs(flags):
    """(start, stop) of each run of 1s."""
    edges = np.diff(np.concatenate([[0], flags, [0]]))
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)))


def test_data_format_pins_what_the_extension_would_not_say(tmp_path, chat_tokenizer):
    path = _write_jsonl(tmp_path / "chats.txt", [{"messages": messages} for messages in CHATS])
    meta = prepare(path, chat_tokenizer, tmp_path / "out", data_format="jsonl-chat")
    assert meta["data_format"] == "jsonl-chat" and meta["documents"] == 2
    with pytest.raises(UserError, match="the separator '<|endoftext|>' never occurs"):
        prepare(path, chat_tokenizer, tmp_path / "as-text")


BAD_ROWS = [
    ("not JSON", "not-json", b'{"messages": [\n'),
    ("no messages key", "missing-key", b'{"conversation": []}\n'),
    ("content not a string", "wrong-type", b'{"messages": [{"role": "user", "content": 3}]}\n'),
    ("unknown role", "unknown-role", b'{"messages": [{"role": "bot", "content": "hi"}]}\n'),
    ("empty content", "empty-content", b'{"messages": [{"role": "user", "content": "hi"}, {"role": "model", "content": " "}]}\n'),
    ("line too long", "too-long", b'{"messages": [{"role": "user", "content": "' + b"x" * 300 + b'"}]}\n'),
    ("no model turn", "no-model-turn", b'{"messages": [{"role": "user", "content": "hi"}]}\n'),
    ("system not first", "misplaced-system",
     b'{"messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": "be brief"}]}\n'),
]
GOOD_ROW = json.dumps({"messages": [{"role": "user", "content": "Hi!"}, {"role": "model", "content": "Hello!"}]}).encode() + b"\n"


def test_bad_rows_are_skipped_and_counted_by_reason(tmp_path, chat_tokenizer):
    path = tmp_path / "chats.jsonl"
    path.write_bytes(GOOD_ROW + b"".join(row + GOOD_ROW for _, _, row in BAD_ROWS) + b"\n")
    logged = []
    meta = prepare(path, chat_tokenizer, tmp_path / "out", on_bad_row="skip", max_row_bytes=200, log=logged.append)
    assert meta["skipped_rows"] == {reason: 1 for _, reason, _ in BAD_ROWS}
    assert (meta["rows"], meta["documents"]) == (len(BAD_ROWS) * 2 + 1, len(BAD_ROWS) + 1)
    assert prepare_lib.read_meta(tmp_path / "out")["skipped_rows"] == meta["skipped_rows"]
    assert any(line.startswith(f"skipped {len(BAD_ROWS)} bad rows of 17 (--on-bad-row skip): ") for line in logged)


@pytest.mark.parametrize("case, reason, row", BAD_ROWS, ids=[case for case, _, _ in BAD_ROWS])
def test_a_bad_row_fails_naming_the_file_line_reason_and_the_flag(tmp_path, chat_tokenizer, case, reason, row):
    path = tmp_path / "chats.jsonl"
    path.write_bytes(GOOD_ROW + row)
    with pytest.raises(UserError, match=rf"^data file {path} line 2: {reason} \(.*\); fix the row or pass "
                                        r"--on-bad-row skip to leave such rows out$"):
        prepare(path, chat_tokenizer, tmp_path / "out", max_row_bytes=200)
    assert not (tmp_path / "out").exists()


def test_a_dataset_of_bad_rows_only_is_one_error(tmp_path, chat_tokenizer_path, capsys):
    path = tmp_path / "chats.jsonl"
    path.write_bytes(b"".join(row for _, _, row in BAD_ROWS[:3]))
    argv = ["--input", str(path), "--tokenizer", str(chat_tokenizer_path), "--output", str(tmp_path / "out"),
            "--on-bad-row", "skip"]
    assert main(argv) == contract.USER_ERROR
    assert capsys.readouterr().err == (
        f"error: data file {path}: all 3 rows are bad (missing-key 1, not-json 1, wrong-type 1); the first, line 1: "
        "not-json (not JSON (Expecting value)); fix the rows or pass another file\n")
    assert not (tmp_path / "out").exists()


def test_parquet_without_the_formats_columns_is_one_error(tmp_path, chat_tokenizer):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "hi", "answer": "hello"}]), path)
    with pytest.raises(UserError, match=r"its columns \(question, answer\) have no \"messages\""):
        prepare(path, chat_tokenizer, tmp_path / "out")
    with pytest.raises(UserError, match=r"no column messages for --data-format parquet-chat"):
        prepare(path, chat_tokenizer, tmp_path / "out", data_format="parquet-chat")


def test_chat_data_needs_a_tokenizer_with_the_turn_tokens(tmp_path, tokenizer):
    path, _ = _write(tmp_path, "jsonl-chat")
    with pytest.raises(UserError, match="no <start_of_turn> or <end_of_turn> piece, which chat data needs"):
        prepare(path, tokenizer, tmp_path / "out")


def test_an_output_prepared_with_other_options_is_refused(tmp_path, chat_tokenizer):
    path, _ = _write(tmp_path, "jsonl-chat")
    prepare(path, chat_tokenizer, tmp_path / "out", loss_on="all")
    with pytest.raises(UserError, match="already prepared from .* --loss-on all\\); remove it or pass another --output"):
        prepare(path, chat_tokenizer, tmp_path / "out")


def test_a_text_directory_of_format_1_is_still_read_and_reused(tmp_path, prepared_dir, corpus_path, tokenizer,
                                                                tokenized_data):
    """What trainer.data.prepare wrote before data formats existed: no data_format, loss_on or loss_mask."""
    old = tmp_path / "old"
    old.mkdir()
    for file in prepared_dir.iterdir():
        (old / file.name).write_bytes(file.read_bytes())
    meta = json.loads((old / "meta.json").read_text())
    for key in ("data_format", "loss_on", "loss_mask", "rows", "skipped_rows"):
        del meta[key]
    for key in ("data_format", "loss_on"):
        del meta["source"][key]
    (old / "meta.json").write_text(json.dumps({**meta, "format": 1}))
    assert prepare(corpus_path, tokenizer, old)["format"] == 1  # reused, not refused
    data = open_data(str(old), tokenizer=tokenizer, cache_dir=str(tmp_path / "cache"))
    assert data.data_format == "text"
    new, again = (next(batches(d, seq_len=64, global_batch_size=4, seed=0, prefetch=False)) for d in (tokenized_data, data))
    assert all(np.array_equal(new[key], again[key]) for key in new)


def test_a_parquet_row_over_the_limit_is_skipped_as_too_long(tmp_path, chat_tokenizer):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "x" * 300, "response": "long"}, {"prompt": "Hi!", "response": "Hello!"}]),
                   path)
    meta = prepare(path, chat_tokenizer, tmp_path / "out", on_bad_row="skip", max_row_bytes=200)
    assert (meta["skipped_rows"], meta["documents"]) == ({"too-long": 1}, 1)
