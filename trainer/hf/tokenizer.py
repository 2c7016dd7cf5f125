"""The tokenizer files of a Hugging Face export: the run's SentencePiece model, the files that
`transformers.AutoTokenizer` reads beside it, and generation_config.json (which ids stop generation).

The chat template is Gemma's turn format (REFERENCE 8, trainer.data.chat): it is written only when the
tokenizer has the turn markers as pieces of their own. A message's content is a string or, as Hugging Face chat
datasets and Gemma's own template have it, a list of text and image parts; an image part is `<start_of_image>`,
which transformers' Gemma3Processor expands into the image's tokens between the markers, as the trainer lays them
out (trainer.data.chat). A vision-language export whose tokenizer has the image markers also names them and its
image token (past the SentencePiece pieces, as Google's tokenizer.json adds it) for that processor, and holds the
template in chat_template.jinja too, where the processor reads it (its other files: trainer.hf.processor).
"""

from __future__ import annotations

import json
import pathlib

from trainer.data.chat import END_OF_IMAGE, END_OF_TURN, START_OF_IMAGE, START_OF_TURN
from trainer.hf.tokenizer_json import tokenizer_json

IMAGE_TOKEN = "<image_soft_token>"  # the name Gemma 3's tokenizer.json gives the image token

# Gemma's turns; "assistant" is "model"; no system role: a system message opens the first user turn,
# followed by a blank line. Content is rendered as written (the trainer trains on it so).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set messages = messages | list -%}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] ~ '\\n\\n' -%}{%- set messages = messages[1:] -%}"
    "{%- else -%}{%- set system = '' -%}{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "{{ raise_exception('Gemma has no system role after the first message') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' ~ role ~ '\\n' ~ (system if loop.first else '') }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{ '<start_of_image>' }}{%- elif part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)


def _has_pieces(processor, pieces) -> bool:
    return all(processor.piece_to_id(piece) != processor.unk_id() for piece in pieces)


def has_turn_markers(processor) -> bool:
    return _has_pieces(processor, (START_OF_TURN, END_OF_TURN))


def has_image_markers(tokenizer) -> bool:
    """Whether a vision-language export of this tokenizer can be Gemma3Processor's: the chat template and the image markers."""
    return _has_pieces(tokenizer.processor, (START_OF_TURN, END_OF_TURN, START_OF_IMAGE, END_OF_IMAGE))


def stop_ids(tokenizer) -> list[int]:
    """EOS, and `<end_of_turn>` where the tokenizer has it (a chat model ends its turn with it)."""
    processor = tokenizer.processor
    return [tokenizer.eos_id, processor.piece_to_id(END_OF_TURN)] if has_turn_markers(processor) else [tokenizer.eos_id]


def generation_config_json(tokenizer) -> dict:
    return {"bos_token_id": tokenizer.bos_id, "eos_token_id": stop_ids(tokenizer), "pad_token_id": tokenizer.pad_id}


def write_tokenizer_files(tokenizer, directory: pathlib.Path, *, image_token_id: int | None = None) -> None:
    """tokenizer.model (the run's file, as loaded), the same as tokenizer.json (what transformers and
    vLLM load), tokenizer_config.json, special_tokens_map.json; with `image_token_id` (a vision-language
    model's) and the image markers, the image tokens Gemma3Processor reads and chat_template.jinja."""
    processor, model_bytes = tokenizer.processor, tokenizer.model_bytes
    special = {
        "bos_token": processor.id_to_piece(tokenizer.bos_id),
        "eos_token": processor.id_to_piece(tokenizer.eos_id),
        "pad_token": processor.id_to_piece(tokenizer.pad_id),
        "unk_token": processor.id_to_piece(processor.unk_id()),
    }
    config = {
        # tokenizer.json as written: GemmaTokenizer would impose Gemma's SentencePiece options (hf_tokenizer_json)
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "add_bos_token": True,  # the trainer's documents start with BOS (trainer.data.loader), and Gemma's prompts do
        "add_eos_token": False,
        "model_max_length": 32_768,
        "padding_side": "left",
        "spaces_between_special_tokens": False,
        "clean_up_tokenization_spaces": False,
    }
    if has_turn_markers(processor):
        config["chat_template"] = CHAT_TEMPLATE
        special["additional_special_tokens"] = [START_OF_TURN, END_OF_TURN]
    converted = tokenizer_json(model_bytes)
    if image_token_id is not None and has_image_markers(tokenizer):
        if image_token_id >= processor.get_piece_size():  # not a piece of the run's tokenizer
            converted["added_tokens"].append({"id": image_token_id, "content": IMAGE_TOKEN, "single_word": False,
                                              "lstrip": False, "rstrip": False, "normalized": False, "special": True})
        config.update(boi_token=START_OF_IMAGE, eoi_token=END_OF_IMAGE, image_token=IMAGE_TOKEN)
        (directory / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    (directory / "tokenizer.model").write_bytes(model_bytes)
    (directory / "tokenizer.json").write_text(json.dumps(converted, ensure_ascii=False), encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n", encoding="utf-8")
