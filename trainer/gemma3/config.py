"""Gemma 3 text architectures: the shapes of the published models, and a tiny one for CPU.

The figures are those of gemma 4.0.1's `gm.nn.Gemma3_*` configs and of Google's Hugging Face configs
(tests/trainer/test_gemma3.py compares them with gemma's). Every Gemma 3 layer has QK-norm, pre and
post norms around attention and feed-forward, grouped-query attention and a gated GELU feed-forward;
layers repeat five local (sliding-window) attention layers and one global.
"""

from __future__ import annotations

import dataclasses
import enum


class Attention(enum.Enum):
    """A layer's attention; the values are Hugging Face's `layer_types`."""

    LOCAL = "sliding_attention"
    GLOBAL = "full_attention"


PATTERN = (Attention.LOCAL,) * 5 + (Attention.GLOBAL,)
RMS_EPSILON = 1e-6


@dataclasses.dataclass(frozen=True, kw_only=True)
class Gemma3Config:
    num_embed: int  # vocabulary size
    embed_dim: int
    hidden_dim: int  # feed-forward width
    num_heads: int
    head_dim: int
    num_kv_heads: int
    num_layers: int
    sliding_window_size: int  # a local layer's query at q sees keys q - window < k <= q
    query_pre_attn_scalar: int  # queries are scaled by its inverse square root (Hugging Face's key)
    global_scale_factor: float = 1.0  # linear RoPE scaling of the global layers (4b and larger)
    local_base_frequency: int = 10_000
    global_base_frequency: int = 1_000_000
    final_logit_softcap: float | None = None  # none in Gemma 3; kept for the loss head's generality

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads or self.num_heads == self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} must be a multiple of num_kv_heads {self.num_kv_heads}, "
                             "and larger (Gemma 3 has separate query and key/value projections)")

    @property
    def attention_types(self) -> tuple[Attention, ...]:
        return tuple(PATTERN[i % len(PATTERN)] for i in range(self.num_layers))

    def rope(self, kind: Attention) -> tuple[int, float]:
        """(base frequency, scale factor) of a layer's rotary embedding."""
        if kind is Attention.LOCAL:
            return self.local_base_frequency, 1.0
        return self.global_base_frequency, self.global_scale_factor


_VOCAB = 262_144
MODELS = {
    "gemma3-270m": Gemma3Config(num_embed=_VOCAB, embed_dim=640, hidden_dim=2048, num_heads=4, head_dim=256,
                                num_kv_heads=1, num_layers=18, sliding_window_size=512, query_pre_attn_scalar=256),
    "gemma3-1b": Gemma3Config(num_embed=_VOCAB, embed_dim=1152, hidden_dim=6912, num_heads=4, head_dim=256,
                              num_kv_heads=1, num_layers=26, sliding_window_size=512, query_pre_attn_scalar=256),
    "gemma3-4b": Gemma3Config(num_embed=_VOCAB, embed_dim=2560, hidden_dim=10240, num_heads=8, head_dim=256,
                              num_kv_heads=4, num_layers=34, sliding_window_size=1024, query_pre_attn_scalar=256,
                              global_scale_factor=8.0),
    "gemma3-12b": Gemma3Config(num_embed=_VOCAB, embed_dim=3840, hidden_dim=15360, num_heads=16, head_dim=256,
                               num_kv_heads=8, num_layers=48, sliding_window_size=1024, query_pre_attn_scalar=256,
                               global_scale_factor=8.0),
    # 27b scales queries by embed_dim / num_heads (168), not its head_dim (128)
    "gemma3-27b": Gemma3Config(num_embed=_VOCAB, embed_dim=5376, hidden_dim=21504, num_heads=32, head_dim=128,
                               num_kv_heads=16, num_layers=62, sliding_window_size=1024, query_pre_attn_scalar=168,
                               global_scale_factor=8.0),
}

def tiny(vocab_size: int) -> Gemma3Config:
    """The Gemma 3 architecture small enough to train on a laptop CPU (its four layers are local ones,
    as the pattern gives)."""
    return Gemma3Config(num_embed=vocab_size, embed_dim=128, hidden_dim=512, num_heads=4, head_dim=32, num_kv_heads=1,
                        num_layers=4, sliding_window_size=64, query_pre_attn_scalar=32)
