"""What transformers' Gemma3Processor reads beside a vision-language export's model and tokenizer files (issue 53):
preprocessor_config.json (how a picture becomes pixel values: converted to RGB, resized bilinearly to the encoder's
square, scaled by 1/255, normalised with mean and standard deviation 0.5, as trainer.data.images prepares them for
training) and processor_config.json (the image tokens a picture stands for). The image tokens' names and the chat
template's image parts are the tokenizer's files' (trainer.hf.tokenizer), written with these."""

from __future__ import annotations

import json
import pathlib

from trainer.gemma3.config import VisionConfig

PROCESSOR_CLASS = "Gemma3Processor"
_BILINEAR = 2  # PIL.Image.Resampling.BILINEAR, as the image processor's config names it


def preprocessor_config_json(vision: VisionConfig) -> dict:
    return {
        "image_processor_type": "Gemma3ImageProcessor",
        "processor_class": PROCESSOR_CLASS,
        "do_convert_rgb": True,
        "do_resize": True,
        "size": {"height": vision.image_size, "width": vision.image_size},
        "resample": _BILINEAR,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "do_pan_and_scan": False,  # one crop an image: the trainer reads images whole
    }


def write_processor_files(directory: pathlib.Path, vision: VisionConfig) -> None:
    for name, value in (("preprocessor_config.json", preprocessor_config_json(vision)),
                        ("processor_config.json", {"processor_class": PROCESSOR_CLASS, "image_seq_length": vision.soft_tokens})):
        (directory / name).write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
