"""Where each Gemma 3 weight (trainer.gemma3, gemma's tree) goes in Hugging Face's Gemma3ForCausalLM, and LoRA adapters in PEFT's.

The model keeps a projection as an einsum weight with named axes (q_einsum [heads, embed, head_dim],
kv_einsum [k|v, kv_heads, embed, head_dim], attn_vec_einsum [heads, head_dim, embed],
gating_einsum [gate|up, hidden, embed], linear [hidden, embed]); torch's nn.Linear keeps [out, in]
with the heads flattened head-major. Norm scales are stored the same way in both (both apply
x * (1 + scale)), and both scale the embedding by sqrt(embed_dim) themselves; the output layer is
the tied embedding.

Our LoRA (gemma's tree) gives every einsum weight one A over the weight's input axes and one B over
its output axes, delta = A @ B with no scaling. A fused weight (kv_einsum, gating_einsum) thus has
one A for both halves: PEFT's lora_A of k_proj and v_proj (gate_proj and up_proj) is that same A,
and each lora_B is its half of B. lora_alpha = r makes PEFT's scale alpha / r exactly 1.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
PEFT_PREFIX = "base_model.model."


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One Hugging Face tensor: its name, the gm parameter it comes from (`part`: (axis, index) of
    a fused one's half), and how it is laid out."""

    name: str
    source: tuple[str, ...]
    convert: Callable[[np.ndarray], np.ndarray]
    part: tuple[int, int] | None = None

    def size(self, source_shape: tuple[int, ...]) -> int:
        """Its number of elements, from the gm parameter's shape."""
        return math.prod(source_shape) // (source_shape[self.part[0]] if self.part else 1)

    def of(self, source: np.ndarray) -> np.ndarray:
        """The tensor, from the gm parameter's value."""
        return self.convert(np.take(source, self.part[1], axis=self.part[0]) if self.part else source)


def _same(w: np.ndarray) -> np.ndarray:
    return w


def _heads_out(w: np.ndarray) -> np.ndarray:
    """[heads, embed, head_dim] -> [heads * head_dim, embed]."""
    return w.transpose(0, 2, 1).reshape(-1, w.shape[1])


def _heads_in(w: np.ndarray) -> np.ndarray:
    """[heads, head_dim, embed] -> [embed, heads * head_dim]."""
    return w.reshape(-1, w.shape[-1]).T


def _transpose(w: np.ndarray) -> np.ndarray:
    return w.T


def model_tensors(config) -> list[Tensor]:
    """Every tensor of Gemma3ForCausalLM for a plain (LoRA-free) gm tree of `config`."""
    tensors = [
        Tensor("model.embed_tokens.weight", ("embedder", "input_embedding"), _same),
        Tensor("model.norm.weight", ("final_norm", "scale"), _same),
    ]
    for i in range(config.num_layers):
        layer, name = f"layer_{i}", f"model.layers.{i}."
        tensors += [
            Tensor(name + "input_layernorm.weight", (layer, "pre_attention_norm", "scale"), _same),
            Tensor(name + "post_attention_layernorm.weight", (layer, "post_attention_norm", "scale"), _same),
            Tensor(name + "pre_feedforward_layernorm.weight", (layer, "pre_ffw_norm", "scale"), _same),
            Tensor(name + "post_feedforward_layernorm.weight", (layer, "post_ffw_norm", "scale"), _same),
            Tensor(name + "self_attn.q_norm.weight", (layer, "attn", "_query_norm", "scale"), _same),
            Tensor(name + "self_attn.k_norm.weight", (layer, "attn", "_key_norm", "scale"), _same),
            Tensor(name + "self_attn.q_proj.weight", (layer, "attn", "q_einsum", "w"), _heads_out),
            Tensor(name + "self_attn.k_proj.weight", (layer, "attn", "kv_einsum", "w"), _heads_out, (0, 0)),
            Tensor(name + "self_attn.v_proj.weight", (layer, "attn", "kv_einsum", "w"), _heads_out, (0, 1)),
            Tensor(name + "self_attn.o_proj.weight", (layer, "attn", "attn_vec_einsum", "w"), _heads_in),
            Tensor(name + "mlp.gate_proj.weight", (layer, "mlp", "gating_einsum"), _same, (0, 0)),  # [2, hidden, embed]: [out, in]
            Tensor(name + "mlp.up_proj.weight", (layer, "mlp", "gating_einsum"), _same, (0, 1)),
            Tensor(name + "mlp.down_proj.weight", (layer, "mlp", "linear"), _transpose),
        ]
    return tensors


def _a_rank_last(a: np.ndarray) -> np.ndarray:
    """gm's A [input axes..., r] -> PEFT's lora_A [r, inputs]."""
    return a.reshape(-1, a.shape[-1]).T


def _b_rank_first(b: np.ndarray) -> np.ndarray:
    """gm's B [r, output axes...] -> PEFT's lora_B [outputs, r]."""
    return b.reshape(b.shape[0], -1).T


def lora_tensors(num_layers: int) -> list[Tensor]:
    """PEFT's adapter_model.safetensors tensors for an adapters tree (trainer.models.adapters_only)."""
    tensors = []
    for i in range(num_layers):
        layer, name = f"layer_{i}", f"{PEFT_PREFIX}model.layers.{i}."
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
                Tensor(f"{name}{module}.lora_A.weight", (*source, "a"), _a_rank_last),
                Tensor(f"{name}{module}.lora_B.weight", (*source, "b"), _b_rank_first, b_part),
            ]
    return tensors


def lookup(tree, path: tuple[str, ...]):
    for key in path:
        tree = tree[key]
    return tree
