"""Gemma's chat template, as pieces of text that say whether they are trained, and their tokens.

A conversation renders as `<start_of_turn>user\\n{text}<end_of_turn>\\n<start_of_turn>model\\n{text}<end_of_turn>\\n`
per turn (the loader puts BOS before it, trainer.data.prepare EOS after it). Role "assistant" is "model";
Gemma has no system role, so a system turn is folded into the first user turn (system content, a
blank line, the user's content), as Gemma's own template does. With loss on completions, a model
turn's content, its `<end_of_turn>` and the newline after it are trained, and the EOS after a
conversation that ends with a model turn; everything else is context.

Each piece is tokenized on its own and the ids are joined, so a mask boundary is exactly a piece
boundary; the turn markers are single special tokens, never spelled out of text pieces.

An image part of a message renders as Gemma 3's processor expands it: `\n\n<start_of_image>`, the image's soft
tokens (as many image tokens as the encoder gives an image: trainer.data.images.Layout), `<end_of_image>\n\n`. The markers
and soft tokens are never trained (a soft token is no word to predict); the newlines go with their turn.
"""

from __future__ import annotations

import dataclasses
import functools

from trainer.data.formats import EMPTY_CONTENT, ImagePart, InvalidRow, content_text
from trainer.errors import UserError

START_OF_TURN, END_OF_TURN = "<start_of_turn>", "<end_of_turn>"
TURN_TOKENS = (START_OF_TURN, END_OF_TURN)
START_OF_IMAGE, END_OF_IMAGE = "<start_of_image>", "<end_of_image>"
IMAGE_MARKERS = (START_OF_IMAGE, END_OF_IMAGE)
COMPLETIONS, ALL = "completions", "all"
LOSS_ON = (COMPLETIONS, ALL)
USER, MODEL, SYSTEM = "user", "model", "system"
_ROLES = {"user": USER, "model": MODEL, "assistant": MODEL, "system": SYSTEM}
# Why a conversation is refused (beside trainer.data.formats' reasons).
UNKNOWN_ROLE, MISPLACED_SYSTEM, NO_MODEL_TURN = "unknown-role", "misplaced-system", "no-model-turn"


@dataclasses.dataclass(frozen=True)
class Piece:
    text: str
    trained: bool
    special: bool = False  # a turn or image marker: one token
    image: object = None  # an image's soft tokens (text ""): the row's ImagePart, then its pixels (trainer.data.prepare)


def _turns(messages) -> list[tuple[str, str]]:
    """(role, content) with Gemma's role names and the system turn folded into the first user turn."""
    turns = []
    for number, (role, content) in enumerate(messages, start=1):
        if role not in _ROLES:
            raise InvalidRow(UNKNOWN_ROLE, f"message {number} has role {role!r}, not one of {', '.join(_ROLES)}")
        if not content_text(content).strip() and not any(isinstance(part, ImagePart) for part in content):
            raise InvalidRow(EMPTY_CONTENT, f"message {number} ({role}) has no content")
        turns.append((_ROLES[role], content))
    if turns[0][0] == SYSTEM:
        if len(turns) < 2 or turns[1][0] != USER:
            raise InvalidRow(MISPLACED_SYSTEM, "the system message is not followed by a user message")
        turns[:2] = [(USER, _joined(turns[0][1], "\n\n", turns[1][1]))]
    if any(role == SYSTEM for role, _ in turns):
        raise InvalidRow(MISPLACED_SYSTEM, "a system message after the first message")
    return turns


def _joined(*contents):
    """Contents (strings or tuples of parts) one after the other: a string when all are."""
    if all(isinstance(content, str) for content in contents):
        return "".join(contents)
    return tuple(part for content in contents for part in ((content,) if isinstance(content, str) else content))


def _content(content, trained: bool) -> list[Piece]:
    if isinstance(content, str):
        return [Piece(content, trained)]
    pieces = []
    for part in content:
        if isinstance(part, str):
            pieces.append(Piece(part, trained))
        else:
            pieces += [Piece("\n\n", trained), Piece(START_OF_IMAGE, False, special=True), Piece("", False, image=part),
                       Piece(END_OF_IMAGE, False, special=True), Piece("\n\n", trained)]
    return [piece for piece in pieces if piece.text or piece.image is not None]


def _turn(role: str, content, *, trained: bool, header_trained: bool = False) -> list[Piece]:
    return [Piece(START_OF_TURN, header_trained, special=True), Piece(f"{role}\n", header_trained),
            *_content(content, trained), Piece(END_OF_TURN, trained, special=True), Piece("\n", trained)]


def render(messages, *, loss_on: str) -> list[Piece]:
    """The pieces of a conversation ((role, content), ...); InvalidRow for one that cannot be trained on."""
    turns = _turns(messages)
    if loss_on == COMPLETIONS and not any(role == MODEL for role, _ in turns):
        raise InvalidRow(NO_MODEL_TURN, "no model or assistant message to train on, which --loss-on all does not need")
    return [piece for role, content in turns
            for piece in _turn(role, content, trained=loss_on == ALL or role == MODEL, header_trained=loss_on == ALL)]


def render_prompt(prompt) -> list[Piece]:
    """A user turn (a string, or a tuple of text and image parts) and the opening of the model's: what
    generation continues."""
    return [*_turn(USER, prompt, trained=False), Piece(START_OF_TURN, False, special=True), Piece(f"{MODEL}\n", False)]


def text_of(pieces: list[Piece]) -> str:
    return "".join(piece.text for piece in pieces)


@functools.lru_cache(maxsize=8)  # once per tokenizer, not per batch of documents
def turn_token_ids(tokenizer, markers: tuple[str, ...] = TURN_TOKENS) -> dict[str, int]:
    """The ids of <start_of_turn> and <end_of_turn> (and of the other `markers`). UserError when the tokenizer
    lacks them as single pieces or adds a space before every piece (its tokens would not join into the rendered text)."""
    processor = tokenizer.processor
    ids = {token: processor.piece_to_id(token) for token in markers}
    missing = [token for token, token_id in ids.items() if token_id == processor.unk_id()]
    if missing:
        raise UserError(f"tokenizer {tokenizer.path}: no {' or '.join(missing)} piece, which chat data needs; use "
                        "Gemma 3's tokenizer (--tokenizer official) or one trained for chat (--preset tiny-chat)")
    from sentencepiece import sentencepiece_model_pb2  # here: trainer.config reads LOSS_ON without SentencePiece

    spec = sentencepiece_model_pb2.ModelProto.FromString(processor.serialized_model_proto()).normalizer_spec
    if spec.add_dummy_prefix:
        raise UserError(f"tokenizer {tokenizer.path}: adds a space before every text (add_dummy_prefix), so chat "
                        "pieces tokenized apart would not join; use Gemma 3's tokenizer or one trained for chat")
    return ids


def tokenize(tokenizer, documents: list[list[Piece]], *, threads: int = 1,
             image_layout=None) -> list[tuple[list[int], list[bool]]]:
    """(token ids, trained flag per id) of each document: its text pieces tokenized in one batch call,
    the markers as their ids, an image as `image_layout`'s soft tokens (trainer.data.images.Layout)."""
    imaged = any(p.image is not None for pieces in documents for p in pieces)
    special = turn_token_ids(tokenizer, TURN_TOKENS + IMAGE_MARKERS if imaged else TURN_TOKENS) \
        if any(p.special for pieces in documents for p in pieces) else {}
    texts = [piece.text for pieces in documents for piece in pieces if not piece.special and piece.image is None]
    encoded = iter(tokenizer.encode_batch(texts, threads=threads))
    tokenized = []
    for pieces in documents:
        ids, trained = [], []
        for piece in pieces:
            if piece.image is not None:
                piece_ids = [image_layout.token_id] * image_layout.soft_tokens
            else:
                piece_ids = [special[piece.text]] if piece.special else next(encoded)
            ids += piece_ids
            trained += [piece.trained] * len(piece_ids)
        tokenized.append((ids, trained))
    return tokenized
