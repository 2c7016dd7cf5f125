"""A Hugging Face Gemma 3 directory, or a PEFT LoRA adapter on one, as a run's starting weights
(`--weights HF_DIR`, `--lora-weights ADAPTER_DIR`; local or gs://).

A model directory is config.json with model.safetensors, or shards named by
model.safetensors.index.json; Gemma3ForCausalLM, or Gemma3ForConditionalGeneration: its text part (the
`language_model.` names) alone for a text model, and its vision tower and projector too for a
vision-language one (a VisionConfig given). An adapter directory is what PEFT and
`trainer.export --lora-export adapter` write: adapter_config.json with adapter_model.safetensors.
Everything a user can get wrong is checked from config.json and the files' headers before a weight
is read. The weights go straight into the run's shardings: each process reads the rows of its
blocks only (trainer.hf.weights says which), as float32 masters whatever the stored dtype.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable

import jax
import numpy as np
from etils import epath

from trainer.errors import UserError
from trainer.hf import config as hf_config, weights as hf_weights
from trainer.hf.safetensors_file import NotSafetensors, SafetensorsFile

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
TEXT_MODEL = "Gemma3ForCausalLM"
MULTIMODAL_MODEL = "Gemma3ForConditionalGeneration"
MODEL_TYPES = ("gemma3_text", "gemma3")
# Where transformers keeps the text model's `model.` names: its own, 5's multimodal class, 4.5x's.
TEXT_PREFIXES = ("model.", "model.language_model.", "language_model.model.")
# Where each part's names (trainer.hf.weights) may be stored: Google's checkpoints and transformers 4.5x write
# the first; transformers 5 (in memory, and on disk at 5.23) the others.
STORED_PREFIXES = {
    hf_weights.VISION_TOWER: (hf_weights.VISION_TOWER, "vision_tower.", "model.vision_tower.vision_model.", "model.vision_tower."),
    hf_weights.PROJECTOR: (hf_weights.PROJECTOR, "model.multi_modal_projector."),
    "model.": TEXT_PREFIXES,
}
# Weights besides the ones a PEFT adapter of this trainer's LoRA has, that it cannot take on.
_UNSUPPORTED_ADAPTER = {"rank_pattern": "per-module ranks", "alpha_pattern": "per-module alphas",
                        "layers_to_transform": "adapters on some layers only", "use_dora": "DoRA"}


def is_model_directory(path: str) -> bool:
    """A Hugging Face model directory (by its config.json), rather than an Orbax checkpoint."""
    return (epath.Path(path) / CONFIG).exists()


def _read_json(path: epath.Path, flag: str, directory: str) -> dict:
    """A JSON object file of the directory (config.json, an index, adapter_config.json)."""
    try:
        found = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{flag} {directory}: no {path.name} there") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UserError(f"{flag} {directory}: {path.name} is not JSON ({error})") from None
    if not isinstance(found, dict):
        raise UserError(f"{flag} {directory}: {path.name} is a JSON {type(found).__name__}, not an object")
    return found


def _shard_files(index: dict, flag: str, directory: str) -> list[str]:
    """The files an index's weight_map names: a map of tensor names to file names in the directory."""
    weight_map = index.get("weight_map")
    if not (isinstance(weight_map, dict) and all(isinstance(f, str) and f and "/" not in f for f in weight_map.values())):
        raise UserError(f"{flag} {directory}: {INDEX}'s weight_map is not a map of tensor names to file names")
    return sorted(set(weight_map.values()))


class _Tensors:
    """The safetensors files of a directory, their tensors by name, and reads of a gm weight's block."""

    def __init__(self, directory: str, files: list[str], flag: str):
        self.directory, self.flag = directory, flag
        self.location: dict[str, SafetensorsFile] = {}
        for name in files:
            path = epath.Path(directory) / name
            if not path.exists():
                raise UserError(f"{flag} {directory}: {name} is missing; copy the whole directory")
            try:
                file = SafetensorsFile(path)
            except NotSafetensors as error:
                raise UserError(f"{flag} {directory}: {name} is no safetensors file this trainer reads: {error}") from None
            self.location.update(dict.fromkeys(file.entries, file))

    @property
    def bytes_read(self) -> int:
        return sum(file.bytes_read for file in set(self.location.values()))

    def stored_name(self, name: str, prefix: str) -> str:
        """Where the table's `prefix`-`model.`... name (or vision tower's, or projector's) is stored: with the
        text model's own prefix, or a multimodal model's, of either transformers generation."""
        name = name.removeprefix(prefix)
        part = next(start for start in STORED_PREFIXES if name.startswith(start))
        for stored_prefix in STORED_PREFIXES[part]:
            if prefix + stored_prefix + name.removeprefix(part) in self.location:
                return prefix + stored_prefix + name.removeprefix(part)
        raise UserError(f"{self.flag} {self.directory}: has no tensor {name} (nor its multimodal name); "
                        "is it a complete Gemma 3 checkpoint?")

    def shape(self, stored: str) -> tuple[int, ...]:
        return self.location[stored].entries[stored].shape

    def check_shape(self, tensor: hf_weights.Tensor, stored: str, source_shape: tuple[int, ...], what: str) -> None:
        want, got = tensor.hf_shape(source_shape), self.shape(stored)
        if got != want:
            raise UserError(f"{self.flag} {self.directory}: {stored} is {list(got)}, {what} needs {list(want)}")

    def part_block(self, tensor: hf_weights.Tensor, stored: str, shape: tuple[int, ...], index: tuple[slice, ...],
                   read: dict | None = None) -> np.ndarray:
        """The block `index` of a gm weight (or fused part) of `shape`, from the rows of the stored tensor it
        needs; `read` keeps the rows read for the weight's other blocks (a process's devices whose blocks
        need the same rows, as replicas or a split across a row, read them once)."""
        layout = tensor.layout
        axis = layout.row_axis % len(shape)
        start, stop, _ = index[axis].indices(shape[axis])
        per_index = layout.rows_per_index(shape)
        key = (stored, start * per_index, stop * per_index)
        read = {} if read is None else read
        if key not in read:
            read[key] = self.location[stored].rows(*key)
        rows = read[key]
        block = layout.from_hf(rows, (*shape[:axis], stop - start, *shape[axis + 1:]))
        return block[tuple(slice(None) if i == axis else s for i, s in enumerate(index))]

    def load(self, tensors: list[hf_weights.Tensor], prefix: str, expected, shardings, scale: Callable[[str], float]):
        """A tree like `expected` (ShapeDtypeStructs) of float32 arrays in `shardings` (a matching tree);
        each tensor's values times `scale(its name)`."""
        by_source: dict[tuple[str, ...], list[hf_weights.Tensor]] = {}
        for tensor in tensors:
            by_source.setdefault(tensor.source, []).append(tensor)

        def array(path, leaf, sharding):
            found, read = by_source[tuple(key.key for key in path)], {}
            return jax.make_array_from_callback(
                tuple(leaf.shape), sharding, lambda index: self._block(found, prefix, tuple(leaf.shape), index, scale, read))

        return jax.tree_util.tree_map_with_path(array, expected, shardings)

    def _block(self, tensors, prefix, shape, index, scale, read: dict) -> np.ndarray:
        first = tensors[0]
        if first.part is None:  # one tensor (or equal ones, as k's and v's LoRA A: the first)
            parts = [(first, shape, index)]
        else:
            axis = first.part[0]
            rest = index[:axis] + index[axis + 1:]
            chosen = range(shape[axis])[index[axis]]
            parts = [(tensors[k], first.part_shape(shape), rest) for k in chosen]
        blocks = [self.part_block(t, self.stored_name(t.name, prefix), s, i, read).astype(np.float32) * np.float32(scale(t.name))
                  for t, s, i in parts]
        return blocks[0] if first.part is None else np.stack(blocks, axis=first.part[0])


class ModelDirectory:
    """A Hugging Face Gemma 3 model directory (see the module docstring)."""

    def __init__(self, path: str, *, flag: str = "--weights"):
        self.path, self.flag = path, flag
        directory = epath.Path(path)
        config = _read_json(directory / CONFIG, flag, path)
        architectures, model_type = config.get("architectures") or [], config.get("model_type")
        named = {name for name in architectures if isinstance(name, str)} if isinstance(architectures, list) else set()
        if model_type not in MODEL_TYPES or not {TEXT_MODEL, MULTIMODAL_MODEL} & named:
            raise UserError(f"{flag} {path}: not a Gemma 3 model (config.json: architectures {architectures}, model_type "
                            f"{model_type!r}); give a {TEXT_MODEL} or {MULTIMODAL_MODEL} directory")
        self.multimodal = model_type == "gemma3"
        self.config = config
        self.text_config = (config.get("text_config") or {}) if self.multimodal else config
        if not isinstance(self.text_config, dict):
            raise UserError(f"{flag} {path}: config.json's text_config is not an object")
        if (directory / INDEX).exists():
            files = _shard_files(_read_json(directory / INDEX, flag, path), flag, path)
        else:
            files = [SINGLE]
        self.tensors = _Tensors(path, files, flag)

    def check(self, model_name: str, model_config, expected, *, tokenizer: str | None = None, vocab_size: int | None = None,
              vision=None) -> None:
        """One line for the first way the directory does not fit `--model model_name` (and its tokenizer, and
        its image encoder `vision`); `expected` is the model's parameter tree as shapes
        (trainer.model.models.check_weights)."""
        ours = hf_config.architecture(hf_config.model_config_json(model_config, dtype="float32", bos_id=0, eos_id=0, pad_id=0))
        try:
            theirs = hf_config.architecture(self.text_config)
        except KeyError as error:
            raise UserError(f"{self.flag} {self.path}: config.json has no {error.args[0]}; is it a complete Gemma 3 config?") from None
        except (TypeError, ValueError, AttributeError) as error:  # a value of another type than Gemma 3's
            raise UserError(f"{self.flag} {self.path}: config.json is no Gemma 3 config this trainer reads ({error})") from None
        for key, value in ours.items():
            if theirs[key] != value:
                raise UserError(f"{self.flag} {self.path}: config.json's {key} is {theirs[key]}, --model {model_name} has "
                                f"{value}; pass the --model the checkpoint is")
        rows = self.tensors.shape(self.tensors.stored_name(hf_weights.EMBEDDING, ""))[0]
        # A multimodal checkpoint's embedding goes on past the text vocabulary (its image tokens): not read.
        if rows < model_config.num_embed or (rows > model_config.num_embed and not self.multimodal):
            with_tokenizer = f" with --tokenizer {tokenizer} ({vocab_size} pieces)" if tokenizer else ""
            raise UserError(f"{self.flag} {self.path}: its embedding has {rows} rows, --model {model_name}{with_tokenizer} "
                            f"has {model_config.num_embed}; use the tokenizer the checkpoint was trained with")
        if vision is not None:
            self._check_vision(model_name, vision)
        abstract = expected
        for tensor in _model_tensors(model_config, vision):
            stored = self.tensors.stored_name(tensor.name, "")
            shape = tuple(hf_weights.lookup(abstract, tensor.source).shape)
            if tensor.name == hf_weights.EMBEDDING:
                shape = (rows, *shape[1:])
            self.tensors.check_shape(tensor, stored, shape, f"--model {model_name}")

    def _check_vision(self, model_name: str, vision) -> None:
        if not self.multimodal:
            raise UserError(f"{self.flag} {self.path}: a text-only Gemma 3 ({TEXT_MODEL}), --model {model_name} reads images; "
                            f"give a {MULTIMODAL_MODEL} directory")
        try:
            theirs = hf_config.vision_config(self.config)
        except (TypeError, ValueError, AttributeError) as error:
            raise UserError(f"{self.flag} {self.path}: config.json's image encoder is none this trainer reads ({error})") from None
        for field in dataclasses.fields(vision):
            if getattr(theirs, field.name) != getattr(vision, field.name):
                raise UserError(f"{self.flag} {self.path}: its image encoder's {field.name} is {getattr(theirs, field.name)}, "
                                f"--model {model_name} has {getattr(vision, field.name)}; pass the --model the checkpoint is")

    def load(self, model_config, expected, shardings, *, vision=None):
        """The plain gm tree `expected` (ShapeDtypeStructs) of float32 arrays in `shardings` (with the image
        encoder and projector, given `vision`)."""
        return self.tensors.load(_model_tensors(model_config, vision), "", expected, shardings, lambda name: 1.0)


def _model_tensors(model_config, vision) -> list[hf_weights.Tensor]:
    return hf_weights.model_tensors(model_config) + (hf_weights.vision_tensors(vision) if vision is not None else [])


class AdapterDirectory:
    """A PEFT LoRA adapter directory, for this trainer's LoRA (trainer.gemma3.model): one A for k and v
    and one for gate and up, delta = A @ B unscaled; PEFT's lora_alpha / r (or / sqrt(r) with rsLoRA)
    is folded into B."""

    def __init__(self, path: str, *, flag: str = "--lora-weights"):
        self.path, self.flag = path, flag
        directory = epath.Path(path)
        self.config = _read_json(directory / ADAPTER_CONFIG, flag, path)
        if self.config.get("peft_type") != "LORA":
            raise UserError(f"{flag} {path}: adapter_config.json's peft_type is {self.config.get('peft_type')!r}; "
                            "this trainer continues LoRA adapters only")
        for key, what in _UNSUPPORTED_ADAPTER.items():
            if self.config.get(key):
                raise UserError(f"{flag} {path}: adapter_config.json sets {key} ({what}), which this trainer's LoRA "
                                "cannot hold; merge the adapter into its base and train from that")
        saved = self.config.get("modules_to_save") or []
        if not (isinstance(saved, list) and all(isinstance(m, str) for m in saved) and set(saved) <= set(hf_weights.SAVED_MODULES)):
            raise UserError(f"{flag} {path}: adapter_config.json's modules_to_save is {saved}; this trainer's LoRA takes "
                            f"only {' and '.join(hf_weights.SAVED_MODULES)} saved whole (a vision-language run's); merge "
                            "the adapter into its base and train from that")
        self.saved_modules: list[str] = saved  # an image model's parts, trained whole beside the LoRA
        self.tensors = _Tensors(path, [ADAPTER_WEIGHTS], flag)

    @property
    def scale(self) -> float:
        rank, alpha = self.config["r"], self.config.get("lora_alpha", 8)  # PEFT's default alpha
        return alpha / (math.sqrt(rank) if self.config.get("use_rslora") else rank)

    def check(self, model_config, expected, *, lora_rank: int, model_expected=None) -> None:
        """`expected`: the adapters' tree as shapes; `model_expected`: the model's, for modules_to_save."""
        if self.config.get("r") != lora_rank:
            raise UserError(f"{self.flag} {self.path}: the adapter's rank (r) is {self.config.get('r')}, the run's "
                            f"--lora-rank {lora_rank}; pass --lora-rank {self.config.get('r')}")
        alpha = self.config.get("lora_alpha")
        if alpha is not None and type(alpha) not in (int, float):
            raise UserError(f"{self.flag} {self.path}: adapter_config.json's lora_alpha is {alpha!r}, not a number")
        modules = self.config.get("target_modules")
        ours = {*hf_weights.ATTENTION_MODULES, *hf_weights.MLP_MODULES}
        listed = isinstance(modules, list) and all(isinstance(module, str) for module in modules)
        if modules not in ("all-linear", hf_weights.MULTIMODAL_TARGET_MODULES) and not (listed and set(modules) == ours):
            raise UserError(f"{self.flag} {self.path}: the adapter's target_modules are {modules}; this trainer's LoRA "
                            f"adapts {', '.join(sorted(ours))}")
        abstract = expected
        tensors = hf_weights.lora_tensors(model_config.num_layers)
        for tensor in tensors:
            stored = self.tensors.stored_name(tensor.name, hf_weights.PEFT_PREFIX)
            self.tensors.check_shape(tensor, stored, tuple(hf_weights.lookup(abstract, tensor.source).shape),
                                     f"--lora-rank {lora_rank} on this model")
        shared = {}
        for tensor in tensors:  # k's and v's lora_A (gate's and up's) are one A here
            if tensor.part is None and tensor.source in shared:
                first = shared[tensor.source]
                a, b = (self.tensors.location[name].tensor(name) for name in (
                    self.tensors.stored_name(first.name, hf_weights.PEFT_PREFIX),
                    self.tensors.stored_name(tensor.name, hf_weights.PEFT_PREFIX)))
                if not np.array_equal(a, b):
                    raise UserError(f"{self.flag} {self.path}: {first.name} and {tensor.name} differ; this trainer's LoRA "
                                    "shares one A between k and v (gate and up), so it cannot continue this adapter")
            shared.setdefault(tensor.source, tensor)
        if self.saved_modules:
            self._check_saved_modules(model_config, model_expected)

    def _check_saved_modules(self, model_config, model_expected) -> None:
        if model_config.vision is None:
            raise UserError(f"{self.flag} {self.path}: the adapter saves {', '.join(self.saved_modules)} whole, parts of "
                            "an image model, and this run's model reads no images; train on data with images")
        for tensor in hf_weights.saved_module_tensors(model_config.vision, self.saved_modules):
            stored = self.tensors.stored_name(tensor.name, hf_weights.PEFT_PREFIX)
            self.tensors.check_shape(tensor, stored, tuple(hf_weights.lookup(model_expected, tensor.source).shape),
                                     "this model's image encoder")

    def load(self, model_config, expected, shardings):
        """The adapters' tree `expected` (trainer.model.models.adapters_only) of float32 arrays in `shardings`."""
        scale = self.scale
        return self.tensors.load(hf_weights.lora_tensors(model_config.num_layers), hf_weights.PEFT_PREFIX, expected,
                                 shardings, lambda name: scale if ".lora_B." in name else 1.0)

    def load_saved_modules(self, model_config, expected, shardings):
        """The modules the adapter saves whole (a vision-language run's projector, and encoder), as the part of the
        model's tree `expected` (ShapeDtypeStructs) that they replace, in `shardings`."""
        return self.tensors.load(hf_weights.saved_module_tensors(model_config.vision, self.saved_modules),
                                 hf_weights.PEFT_PREFIX, expected, shardings, lambda name: 1.0)
