"""A SentencePiece BPE model as a `tokenizers` tokenizer.json that encodes to the same ids.

transformers' GemmaTokenizer rebuilt from tokenizer.model assumes Gemma's own SentencePiece options
(no normalization, no dummy prefix, no whitespace splitting); a tokenizer trained with SentencePiece's
defaults (the demo's) has all three, so its ids would differ. This file states the model's own
options: its normalization table (`Precompiled`, SentencePiece's own charsmap), extra whitespace
removal, the dummy "▁" prefix, whitespace splitting, and BPE merges ranked as SentencePiece merges
(the merged piece with the higher score first). Control and user-defined pieces are added tokens.
"""

from __future__ import annotations

import base64

from sentencepiece import sentencepiece_model_pb2

SPACE = "\u2581"  # SentencePiece's visible space, "▁"
_Piece = sentencepiece_model_pb2.ModelProto.SentencePiece
_ADDED = (_Piece.CONTROL, _Piece.USER_DEFINED, _Piece.UNKNOWN)


def _merges(pieces) -> list[list[str]]:
    """Every (left, right) whose join is a piece, ordered as SentencePiece's BPE merges them."""
    ids = {piece.piece: id_ for id_, piece in enumerate(pieces) if piece.type == _Piece.NORMAL}
    ranked = []
    for id_, piece in enumerate(pieces):
        if piece.type != _Piece.NORMAL:
            continue
        text = piece.piece
        for cut in range(1, len(text)):
            left, right = text[:cut], text[cut:]
            if left in ids and right in ids:
                ranked.append((-piece.score, id_, ids[left], ids[right], left, right))
    return [[left, right] for *_, left, right in sorted(ranked)]


def _normalizer(spec) -> dict | None:
    steps = []
    if spec.precompiled_charsmap:
        steps.append({"type": "Precompiled", "precompiled_charsmap": base64.b64encode(spec.precompiled_charsmap).decode()})
    if spec.remove_extra_whitespaces:
        steps += [{"type": "Strip", "strip_left": True, "strip_right": True},
                  {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]
    return {"type": "Sequence", "normalizers": steps} if steps else None


def tokenizer_json(model_bytes: bytes) -> dict:
    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(model_bytes)
    if model.trainer_spec.model_type != sentencepiece_model_pb2.TrainerSpec.BPE:
        raise ValueError("not a BPE SentencePiece model (Gemma's tokenizers are BPE)")
    pieces = model.pieces
    dummy_prefix = model.normalizer_spec.add_dummy_prefix
    bos_id = model.trainer_spec.bos_id
    bos = pieces[bos_id].piece
    decoders = [{"type": "Replace", "pattern": {"String": SPACE}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}]
    if dummy_prefix:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": id_, "content": piece.piece, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for id_, piece in enumerate(pieces) if piece.type in _ADDED
        ],
        "normalizer": _normalizer(model.normalizer_spec),
        "pre_tokenizer": {"type": "Metaspace", "replacement": SPACE, "prepend_scheme": "first" if dummy_prefix else "never",
                          "split": model.trainer_spec.split_by_whitespace},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
        },
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": pieces[model.trainer_spec.unk_id].piece,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": model.trainer_spec.byte_fallback,
            "ignore_merges": False,
            "vocab": {piece.piece: id_ for id_, piece in enumerate(pieces)},
            "merges": _merges(pieces),
        },
    }
