"""The images of chat rows: where a message's image part points, and its pixels as Gemma 3's processor gives them.

A part `{"type": "image", "image": X}` (Hugging Face's chat datasets) names X: a file path (relative paths are
the data file's folder's), a `data:image/...;base64,` URL, or an object with "bytes" (base64 text in JSON, raw
bytes in Parquet) as the `datasets` library stores images. Decoded with Pillow, converted to RGB and resized to
the encoder's square with bilinear resampling, as Gemma 3's image processor does (no pan-and-scan); the pixels
are kept as uint8 and the step scales them to [-1, 1] (`normalised`: the processor's rescale by 1/255 and its
mean and std of 0.5). A missing, unreadable or oversized image is an InvalidRow that
names it, which trainer.data.prepare refuses or skips as --on-bad-row says.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import pathlib

import numpy as np

from trainer.data.formats import InvalidRow

BAD_IMAGE = "bad-image"  # why a row is refused (beside trainer.data.formats')
# Larger files or pictures are refused before they are decoded: a decompression bomb or a wrong column.
MAX_IMAGE_BYTES = 64 << 20
MAX_IMAGE_PIXELS = 64 << 20
_DATA_URL = "data:"


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a model reads images (trainer.gemma3.config.VisionConfig): `size` pixels square, each image
    `soft_tokens` copies of `token_id` in the text."""

    size: int
    token_id: int
    soft_tokens: int

    def identity(self) -> list[int]:
        return [self.size, self.token_id, self.soft_tokens]


@dataclasses.dataclass(frozen=True)
class Image:
    """A message's image part: `source` is what the row says (a path, a data URL, or inline bytes)."""

    source: str | bytes

    @property
    def name(self) -> str:
        """How a line names the image: its path, or what kind of inline data it is."""
        if isinstance(self.source, bytes):
            return f"inline image of {len(self.source)} bytes"
        return self.source if not self.source.startswith(_DATA_URL) else f"data URL of {len(self.source)} characters"


def normalised(pixels):
    """uint8 RGB pixels [..., size, size, 3] (numpy or jax) -> float32 in [-1, 1], as Gemma 3's processor
    scales them: by 1/255, then the mean 0.5 and standard deviation 0.5 of each channel."""
    return (pixels.astype("float32") / 255.0 - 0.5) / 0.5


def image_part(value) -> Image:
    """The Image of a part's "image" value; InvalidRow when it names none."""
    if isinstance(value, dict) and value.get("bytes") is not None:
        raw = value["bytes"]
        if isinstance(raw, str):
            try:
                raw = base64.b64decode(raw, validate=True)
            except binascii.Error:
                raise InvalidRow(BAD_IMAGE, "an image's \"bytes\" is not base64") from None
        return Image(bytes(raw))
    if isinstance(value, dict) and isinstance(value.get("path"), str):
        return Image(value["path"])
    if isinstance(value, str) and value:
        return Image(value)
    raise InvalidRow(BAD_IMAGE, "an image part's \"image\" is not a path, a data URL or an object with \"bytes\"")


def _encoded(image: Image, folder: pathlib.Path) -> bytes:
    source = image.source
    if isinstance(source, bytes):
        return source
    if source.startswith(_DATA_URL):
        try:
            return base64.b64decode(source.split(",", 1)[1], validate=True)
        except (IndexError, binascii.Error):
            raise InvalidRow(BAD_IMAGE, f"image {image.name}: not a base64 data URL") from None
    if "://" in source:
        raise InvalidRow(BAD_IMAGE, f"image {source}: only local paths are read; mount the bucket (GCS FUSE) and "
                                    "name the files by their path")
    path = folder / source
    if not path.is_file():
        raise InvalidRow(BAD_IMAGE, f"image {path}: not found")
    if path.stat().st_size > MAX_IMAGE_BYTES:
        raise InvalidRow(BAD_IMAGE, f"image {path}: {path.stat().st_size} bytes, over the limit of {MAX_IMAGE_BYTES}")
    return path.read_bytes()


def pixels(image: Image, size: int, *, folder: pathlib.Path) -> np.ndarray:
    """[size, size, 3] uint8: the image decoded, in RGB, resized as Gemma 3's processor resizes it."""
    from PIL import Image as PILImage  # only for data with images

    encoded = _encoded(image, folder)
    name = image.name if isinstance(image.source, bytes) or image.source.startswith(_DATA_URL) else str(folder / image.source)
    try:
        with PILImage.open(io.BytesIO(encoded)) as opened:
            width, height = opened.size
            if width * height > MAX_IMAGE_PIXELS:
                raise InvalidRow(BAD_IMAGE, f"image {name}: {width} x {height} pixels, over the limit of {MAX_IMAGE_PIXELS}")
            resized = opened.convert("RGB").resize((size, size), PILImage.Resampling.BILINEAR)
    except (OSError, ValueError, PILImage.DecompressionBombError):
        raise InvalidRow(BAD_IMAGE, f"image {name}: not an image Pillow reads") from None
    return np.asarray(resized, np.uint8)
