"""An image task the project generates itself, for `--preset tiny-vision` and the tests: pictures of one
shape in one colour, drawn with Pillow, and a chat JSONL that asks about each ("What shape is this?" ->
"A red circle."). The answer can only come from the picture: every question is the same.

Each picture is a PNG beside the JSONL (images/NNNNN.png, named by its path relative to the JSONL's folder,
as trainer.data.images reads it): a white square of SIZE pixels, the shape at a random place and size.

`python -m trainer.data.vision_corpus FOLDER --count N` writes N held-out pictures (those the demo's samples are
asked about: no run trains on them), each named by its answer, to ask an export about (`make vision-demo`).
"""

import argparse
import json
import pathlib
import random

from trainer.shared_files import replaced_atomically

SIZE = 56  # the tiny image encoder's (trainer.gemma3.config.tiny_vision): no resizing
QUESTION = "What shape is this?"
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 70, 220), "yellow": (230, 200, 30)}
SHAPES = ("circle", "square", "triangle")
HELD_OUT_SEED = 2**31 - 1  # the held-out pictures' seed, which no run's training pictures use


def _draw(shape: str, colour: str, rng: random.Random):
    from PIL import Image, ImageDraw  # only for the generated images

    picture = Image.new("RGB", (SIZE, SIZE), (255, 255, 255))
    side = rng.randrange(SIZE // 3, SIZE - 8)
    left, top = rng.randrange(2, SIZE - side - 1), rng.randrange(2, SIZE - side - 1)
    box, fill, draw = (left, top, left + side, top + side), COLOURS[colour], ImageDraw.Draw(picture)
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape == "square":
        draw.rectangle(box, fill=fill)
    else:
        draw.polygon([(left + side // 2, top), (left, top + side), (left + side, top + side)], fill=fill)
    return picture


def pictures(count: int, seed: int):
    """`count` (Pillow picture, the right answer) pairs drawn from `seed`."""
    rng = random.Random(seed)
    for _ in range(count):
        shape, colour = rng.choice(SHAPES), rng.choice(list(COLOURS))
        yield _draw(shape, colour, rng), f"A {colour} {shape}."


def write_vision_corpus(path, *, num_images: int, seed: int = 0) -> pathlib.Path:
    """Writes `num_images` pictures into images/ beside `path` and the chat JSONL about them at `path`."""
    path = pathlib.Path(path)
    folder = path.parent / "images"
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for number, (picture, answer) in enumerate(pictures(num_images, seed)):
        name = f"images/{number:05d}.png"
        picture.save(path.parent / name)
        rows.append({"messages": [
            {"role": "user", "content": [{"type": "image", "image": name}, {"type": "text", "text": QUESTION}]},
            {"role": "model", "content": answer}]})
    with replaced_atomically(path) as temporary:
        temporary.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_held_out(folder, *, count: int) -> list[pathlib.Path]:
    """The first `count` held-out pictures as PNGs in `folder`, named by number and answer (00-a-red-circle.png)."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for number, (picture, answer) in enumerate(pictures(count, HELD_OUT_SEED)):
        paths.append(folder / f"{number:02d}-{answer.rstrip('.').lower().replace(' ', '-')}.png")
        picture.save(paths[-1])
    return paths


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m trainer.data.vision_corpus", description="Write held-out pictures of the tiny-vision task.")
    parser.add_argument("folder", type=pathlib.Path)
    parser.add_argument("--count", type=int, default=4, choices=range(1, 51), metavar="1..50")
    args = parser.parse_args()
    for path in write_held_out(args.folder, count=args.count):
        print(path)
