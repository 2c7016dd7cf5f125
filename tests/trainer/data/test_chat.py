"""Gemma's chat template (trainer.data.chat) and the completion-only loss mask on packed rows, token by token."""

import json

import numpy as np
import pytest

from trainer.data import chat
from trainer.data.loader import batches
from trainer.data.formats import InvalidRow
from trainer.data.tokenizer import load_tokenizer


def test_the_template_is_gemmas_with_the_system_folded_into_the_first_user_turn():
    messages = [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello."), ("user", "2+2?"), ("model", "4.")]
    assert chat.text_of(chat.render(messages, loss_on=chat.COMPLETIONS)) == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n4.<end_of_turn>\n")
    assert chat.text_of(chat.render_prompt("Hi")) == "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"


@pytest.mark.parametrize("messages, reason", [
    ([("user", "hi"), ("bot", "hello")], chat.UNKNOWN_ROLE),
    ([("system", "be brief"), ("model", "hello")], chat.MISPLACED_SYSTEM),
    ([("user", "hi")], chat.NO_MODEL_TURN),
])
def test_a_conversation_that_cannot_be_trained_on_is_refused_with_its_reason(messages, reason):
    with pytest.raises(InvalidRow) as refused:
        chat.render(messages, loss_on=chat.COMPLETIONS)
    assert refused.value.reason == reason


def test_loss_on_all_trains_a_conversation_without_a_model_turn():
    pieces = chat.render([("user", "hi")], loss_on=chat.ALL)
    assert all(piece.trained for piece in pieces)


def _expected(tokenizer, messages):
    """BOS + the conversation's tokens + EOS and, per token, whether it is trained: built here from the
    template's text (turn markers looked up by name), each turn's content tokenized alone."""
    start, end = (tokenizer.processor.piece_to_id(token) for token in ("<start_of_turn>", "<end_of_turn>"))
    ids, trained = [tokenizer.bos_id], [False]
    for turn, (role, content) in enumerate(messages):
        if role == "system":
            continue
        if turn == 1 and messages[0][0] == "system":
            content = f"{messages[0][1]}\n\n{content}"
        model = role in ("model", "assistant")
        for part, is_trained in (([start], False), (tokenizer.encode("model\n" if model else "user\n"), False),
                                 (tokenizer.encode(content), model), ([end], model), (tokenizer.encode("\n"), model)):
            ids += part
            trained += [is_trained] * len(part)
    return np.array(ids + [tokenizer.eos_id]), np.array(trained + [trained[-1]])


@pytest.mark.parametrize("seq_len", [24, 128])
def test_packed_rows_train_exactly_the_model_turns_of_each_window(chat_data, chat_corpus_path, chat_tokenizer_path,
                                                                   seq_len):
    """Every segment of every row of one pass: its targets are a window of one conversation, and its loss
    mask is the trained flags of exactly those targets. At 24 tokens conversations are cut across
    windows; at 128 several share a row."""
    tokenizer = load_tokenizer(chat_tokenizer_path)
    conversations = [[(m["role"], m["content"]) for m in json.loads(line)["messages"]]
                     for line in chat_corpus_path.read_text().splitlines()]
    expected = [_expected(tokenizer, messages) for messages in conversations]
    cut = shared = 0
    for batch in batches(chat_data, seq_len=seq_len, global_batch_size=4, seed=0, epochs=1, prefetch=False):
        for row in range(len(batch["segment_ids"])):
            segments = set(batch["segment_ids"][row]) - {0}
            shared += len(segments) > 1
            for segment in segments:
                at = batch["segment_ids"][row] == segment
                inputs, targets, mask = batch["input_tokens"][row][at], batch["target_tokens"][row][at], batch["loss_mask"][row][at]
                matches = [(ids, trained, start) for ids, trained in expected
                           for start in range(0, len(ids) - 1, seq_len)
                           if np.array_equal(ids[start:start + len(inputs)], inputs)
                           and np.array_equal(ids[start + 1:start + 1 + len(targets)], targets)]
                assert matches, "a segment that is no window of any conversation"
                ids, trained, start = matches[0]
                cut += start > 0
                assert np.array_equal(mask, trained[start + 1:start + 1 + len(targets)])
    assert shared if seq_len == 128 else cut


def test_a_row_of_two_chats_trains_their_answers_and_nothing_of_the_questions(chat_data, chat_tokenizer_path):
    tokenizer = load_tokenizer(chat_tokenizer_path)
    batch = next(batches(chat_data, seq_len=128, global_batch_size=4, seed=0, prefetch=False))
    row = next(r for r in range(4) if len(set(batch["segment_ids"][r]) - {0}) >= 2)
    for segment in sorted(set(batch["segment_ids"][row]) - {0}):
        at = batch["segment_ids"][row] == segment
        targets, mask = batch["target_tokens"][row][at], batch["loss_mask"][row][at]
        text = tokenizer.decode(targets)
        trained = [tokenizer.decode(targets[start:stop]) for start, stop in
                   zip(*(np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])) == edge) for edge in (1, -1)))]
        answers = [part.split("<end_of_turn>")[0] + "<end_of_turn>\n" for part in text.split("<start_of_turn>model\n")[1:]]
        assert trained == answers
        assert targets[-1] == tokenizer.eos_id and mask[-1] == 1
