"""Where each Gemma 3 weight (trainer.gemma3, gemma's tree) goes in Hugging Face's Gemma3ForCausalLM (and the
image encoder and projector in Gemma3ForConditionalGeneration), and LoRA adapters in PEFT's.

One table serves both directions: trainer.export writes a run's tree with it, trainer.hf.load reads
a Hugging Face directory back into one.

The model keeps a projection as an einsum weight with named axes (q_einsum [heads, embed, head_dim],
kv_einsum [k|v, kv_heads, embed, head_dim], attn_vec_einsum [heads, head_dim, embed],
gating_einsum [gate|up, hidden, embed], linear [hidden, embed]); torch's nn.Linear keeps [out, in]
with the heads flattened head-major. Norm scales are stored the same way in both (both apply
x * (1 + scale)), and both scale the embedding by sqrt(embed_dim) themselves; the output layer is
the tied embedding.

The image encoder is flax's: a Dense kernel is [in, out axes...] (attention's query, key and value
[width, heads, head_dim], their biases [heads, head_dim]), the patch convolution [kh, kw, in, out] where
torch's is [out, in, kh, kw]; the position embedding has a leading axis of 1. Our names of the vision
tower's and projector's tensors are Google's published ones (`vision_tower.vision_model.`,
`multi_modal_projector.`); trainer.hf.load also finds them where transformers 5 saves them.

Our LoRA (gemma's tree) gives every einsum weight one A over the weight's input axes and one B over
its output axes, delta = A @ B with no scaling. A fused weight (kv_einsum, gating_einsum) thus has
one A for both halves: PEFT's lora_A of k_proj and v_proj (gate_proj and up_proj) is that same A,
and each lora_B is its half of B. lora_alpha = r makes PEFT's scale alpha / r exactly 1.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

import numpy as np

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
PEFT_PREFIX = "base_model.model."
EMBEDDING = "model.embed_tokens.weight"


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a gm weight is laid out as a torch tensor, both ways. A run of the torch tensor's rows
    (its first axis) is an index range of the gm axis `row_axis`, `rows_per_index(gm shape)` rows an
    index (the axes flattened after it into a row): a part of the weight reads only its rows."""

    to_hf: Callable[[np.ndarray], np.ndarray]
    from_hf: Callable[[np.ndarray, tuple[int, ...]], np.ndarray]  # (torch rows, the gm shape they make) -> gm
    row_axis: int
    rows_per_index: Callable[[tuple[int, ...]], int] = lambda shape: 1

    def hf_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The torch tensor's shape for a gm weight of `shape` (laid out without touching memory)."""
        return self.to_hf(np.broadcast_to(np.zeros((), np.int8), shape)).shape


SAME = Layout(lambda w: w, lambda t, shape: t.reshape(shape), row_axis=0)
# [heads, embed, head_dim] <-> [heads * head_dim, embed]
HEADS_OUT = Layout(lambda w: w.transpose(0, 2, 1).reshape(-1, w.shape[1]),
                   lambda t, shape: t.reshape(shape[0], shape[2], shape[1]).transpose(0, 2, 1),
                   row_axis=0, rows_per_index=lambda shape: shape[2])
# [heads, head_dim, embed] <-> [embed, heads * head_dim]
HEADS_IN = Layout(lambda w: w.reshape(-1, w.shape[-1]).T, lambda t, shape: t.T.reshape(shape), row_axis=2)
# [hidden, embed] <-> [embed, hidden]
TRANSPOSE = Layout(lambda w: w.T, lambda t, shape: t.T.reshape(shape), row_axis=1)
# [1, rows, width] <-> [rows, width]
LEADING_ONE = Layout(lambda w: w[0], lambda t, shape: t.reshape(shape), row_axis=1)
# [out axes...] <-> [out], flattened: a bias of heads
FLAT = Layout(lambda w: w.reshape(-1), lambda t, shape: t.reshape(shape), row_axis=0,
              rows_per_index=lambda shape: math.prod(shape[1:]))
# a convolution's [kh, kw, in, out] <-> torch's [out, in, kh, kw]
CONVOLUTION = Layout(lambda w: w.transpose(3, 2, 0, 1), lambda t, shape: t.transpose(2, 3, 1, 0).reshape(shape), row_axis=3)
# LoRA A [input axes..., r] <-> PEFT's lora_A [r, inputs]
A_RANK_LAST = Layout(lambda a: a.reshape(-1, a.shape[-1]).T, lambda t, shape: t.T.reshape(shape), row_axis=-1)
# A flax Dense kernel [in, output axes...] <-> torch's [outputs, in]; LoRA B [r, output axes...] <-> PEFT's lora_B
# [outputs, r] the same
INPUT_FIRST = Layout(lambda b: b.reshape(b.shape[0], -1).T, lambda t, shape: t.T.reshape(shape), row_axis=1,
                     rows_per_index=lambda shape: math.prod(shape[2:]))
B_RANK_FIRST = INPUT_FIRST


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One Hugging Face tensor: its name, the gm parameter it comes from (`part`: (axis, index) of
    a fused one's half), and how it is laid out."""

    name: str
    source: tuple[str, ...]
    layout: Layout
    part: tuple[int, int] | None = None

    def part_shape(self, source_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of its part of a gm parameter of `source_shape`."""
        return tuple(size for axis, size in enumerate(source_shape) if not self.part or axis != self.part[0])

    def size(self, source_shape: tuple[int, ...]) -> int:
        """Its number of elements, from the gm parameter's shape."""
        return math.prod(self.part_shape(source_shape))

    def hf_shape(self, source_shape: tuple[int, ...]) -> tuple[int, ...]:
        return self.layout.hf_shape(self.part_shape(source_shape))

    def of(self, source: np.ndarray) -> np.ndarray:
        """The tensor, from the gm parameter's value."""
        return self.layout.to_hf(np.take(source, self.part[1], axis=self.part[0]) if self.part else source)


def model_tensors(config) -> list[Tensor]:
    """Every tensor of Gemma3ForCausalLM for a plain (LoRA-free) gm tree of `config`."""
    tensors = [
        Tensor(EMBEDDING, ("embedder", "input_embedding"), SAME),
        Tensor("model.norm.weight", ("final_norm", "scale"), SAME),
    ]
    for i in range(config.num_layers):
        layer, name = f"layer_{i}", f"model.layers.{i}."
        tensors += [
            Tensor(name + "input_layernorm.weight", (layer, "pre_attention_norm", "scale"), SAME),
            Tensor(name + "post_attention_layernorm.weight", (layer, "post_attention_norm", "scale"), SAME),
            Tensor(name + "pre_feedforward_layernorm.weight", (layer, "pre_ffw_norm", "scale"), SAME),
            Tensor(name + "post_feedforward_layernorm.weight", (layer, "post_ffw_norm", "scale"), SAME),
            Tensor(name + "self_attn.q_norm.weight", (layer, "attn", "_query_norm", "scale"), SAME),
            Tensor(name + "self_attn.k_norm.weight", (layer, "attn", "_key_norm", "scale"), SAME),
            Tensor(name + "self_attn.q_proj.weight", (layer, "attn", "q_einsum", "w"), HEADS_OUT),
            Tensor(name + "self_attn.k_proj.weight", (layer, "attn", "kv_einsum", "w"), HEADS_OUT, (0, 0)),
            Tensor(name + "self_attn.v_proj.weight", (layer, "attn", "kv_einsum", "w"), HEADS_OUT, (0, 1)),
            Tensor(name + "self_attn.o_proj.weight", (layer, "attn", "attn_vec_einsum", "w"), HEADS_IN),
            Tensor(name + "mlp.gate_proj.weight", (layer, "mlp", "gating_einsum"), SAME, (0, 0)),  # [2, hidden, embed]: [out, in]
            Tensor(name + "mlp.up_proj.weight", (layer, "mlp", "gating_einsum"), SAME, (0, 1)),
            Tensor(name + "mlp.down_proj.weight", (layer, "mlp", "linear"), TRANSPOSE),
        ]
    return tensors


VISION_TOWER = "vision_tower.vision_model."
PROJECTOR = "multi_modal_projector."
LANGUAGE_MODEL = "language_model."  # before the text model's names in Gemma3ForConditionalGeneration's files


def vision_tensors(vision) -> list[Tensor]:
    """Every tensor of Gemma3ForConditionalGeneration's vision tower and projector, for a VisionConfig."""
    encoder = ("vision_encoder", "siglip_encoder")
    tensors = [
        Tensor(PROJECTOR + "mm_input_projection_weight", ("embedder", "mm_input_projection", "w"), SAME),
        Tensor(PROJECTOR + "mm_soft_emb_norm.weight", ("embedder", "mm_soft_embedding_norm", "scale"), SAME),
        Tensor(VISION_TOWER + "embeddings.patch_embedding.weight", (*encoder, "embedding", "kernel"), CONVOLUTION),
        Tensor(VISION_TOWER + "embeddings.patch_embedding.bias", (*encoder, "embedding", "bias"), SAME),
        Tensor(VISION_TOWER + "embeddings.position_embedding.weight", (*encoder, "pos_embedding"), LEADING_ONE),
        Tensor(VISION_TOWER + "post_layernorm.weight", (*encoder, "Transformer", "encoder_norm", "scale"), SAME),
        Tensor(VISION_TOWER + "post_layernorm.bias", (*encoder, "Transformer", "encoder_norm", "bias"), SAME),
    ]
    for i in range(vision.depth):
        block, name = (*encoder, "Transformer", f"encoderblock_{i}"), f"{VISION_TOWER}encoder.layers.{i}."
        attention = (*block, "MultiHeadDotProductAttention_0")
        tensors += [
            Tensor(name + "layer_norm1.weight", (*block, "LayerNorm_0", "scale"), SAME),
            Tensor(name + "layer_norm1.bias", (*block, "LayerNorm_0", "bias"), SAME),
            Tensor(name + "self_attn.q_proj.weight", (*attention, "query", "kernel"), INPUT_FIRST),
            Tensor(name + "self_attn.q_proj.bias", (*attention, "query", "bias"), FLAT),
            Tensor(name + "self_attn.k_proj.weight", (*attention, "key", "kernel"), INPUT_FIRST),
            Tensor(name + "self_attn.k_proj.bias", (*attention, "key", "bias"), FLAT),
            Tensor(name + "self_attn.v_proj.weight", (*attention, "value", "kernel"), INPUT_FIRST),
            Tensor(name + "self_attn.v_proj.bias", (*attention, "value", "bias"), FLAT),
            Tensor(name + "self_attn.out_proj.weight", (*attention, "out", "kernel"), HEADS_IN),  # [heads, head_dim, width]
            Tensor(name + "self_attn.out_proj.bias", (*attention, "out", "bias"), SAME),
            Tensor(name + "layer_norm2.weight", (*block, "LayerNorm_1", "scale"), SAME),
            Tensor(name + "layer_norm2.bias", (*block, "LayerNorm_1", "bias"), SAME),
            Tensor(name + "mlp.fc1.weight", (*block, "MlpBlock_0", "Dense_0", "kernel"), INPUT_FIRST),
            Tensor(name + "mlp.fc1.bias", (*block, "MlpBlock_0", "Dense_0", "bias"), SAME),
            Tensor(name + "mlp.fc2.weight", (*block, "MlpBlock_0", "Dense_1", "kernel"), INPUT_FIRST),
            Tensor(name + "mlp.fc2.bias", (*block, "MlpBlock_0", "Dense_1", "bias"), SAME),
        ]
    return tensors


def multimodal_tensors(config, vision) -> list[Tensor]:
    """Every tensor of Gemma3ForConditionalGeneration, in Google's layout, for a plain gm tree with an image encoder."""
    return [dataclasses.replace(tensor, name=LANGUAGE_MODEL + tensor.name) for tensor in model_tensors(config)] + vision_tensors(vision)


def lora_tensors(num_layers: int, *, text_model: str = "model.") -> list[Tensor]:
    """PEFT's adapter_model.safetensors tensors for an adapters tree (trainer.model.models.adapters_only), its
    layers under `text_model` (TEXT_IN_MULTIMODAL on a Gemma3ForConditionalGeneration base)."""
    tensors = []
    for i in range(num_layers):
        layer, name = f"layer_{i}", f"{PEFT_PREFIX}{text_model}layers.{i}."
        lora = lambda *einsum: (layer, *einsum, "lora")  # noqa: E731
        q, kv, o = lora("attn", "q_einsum", "_LoRAEinsum_0"), lora("attn", "kv_einsum", "_LoRAEinsum_0"), lora("attn", "attn_vec_einsum", "_LoRAEinsum_0")
        gating, linear = lora("mlp", "_LoRAEinsum_gating_einsum"), lora("mlp", "_LoRAEinsum_linear")
        # A fused weight's B is [r, 2, output axes...]: each half takes its part of axis 1.
        for module, source, b_part in (
            ("self_attn.q_proj", q, None),
            ("self_attn.k_proj", kv, (1, 0)),
            ("self_attn.v_proj", kv, (1, 1)),
            ("self_attn.o_proj", o, None),
            ("mlp.gate_proj", gating, (1, 0)),
            ("mlp.up_proj", gating, (1, 1)),
            ("mlp.down_proj", linear, None),
        ):
            tensors += [
                Tensor(f"{name}{module}.lora_A.weight", (*source, "a"), A_RANK_LAST),
                Tensor(f"{name}{module}.lora_B.weight", (*source, "b"), B_RANK_FIRST, b_part),
            ]
    return tensors


# Where transformers 5's Gemma3ForConditionalGeneration keeps the text layers, and its other parts (PEFT's names).
TEXT_IN_MULTIMODAL = "model.language_model."
# A vision-language adapter's target_modules (PEFT matches a string whole against module names): the text layers'
# projections only, as the vision tower has q_proj, k_proj and v_proj too.
MULTIMODAL_TARGET_MODULES = (re.escape(TEXT_IN_MULTIMODAL) + r"layers\.\d+\.(self_attn|mlp)\.("
                             + "|".join(ATTENTION_MODULES + MLP_MODULES) + ")")
# PEFT's modules_to_save names of the parts a vision-language LoRA run trains whole, and their tensors' prefixes.
SAVED_MODULES = {"multi_modal_projector": PROJECTOR, "vision_tower": VISION_TOWER}


def saved_module_tensors(vision, modules) -> list[Tensor]:
    """PEFT's adapter_model.safetensors tensors of `modules` (SAVED_MODULES' keys) saved whole beside the LoRA, as
    PEFT names a fully trained module of a Gemma3ForConditionalGeneration: without its `modules_to_save.` wrapper."""
    prefixes = tuple(SAVED_MODULES[module] for module in modules)
    return [dataclasses.replace(tensor, name=f"{PEFT_PREFIX}model.{tensor.name}") for tensor in vision_tensors(vision)
            if tensor.name.startswith(prefixes)]


def lookup(tree, path: tuple[str, ...]):
    for key in path:
        tree = tree[key]
    return tree
