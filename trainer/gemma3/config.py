"""Gemma 3 architectures: the text models' shapes (the published ones, and a tiny one for CPU), and the
vision encoder (SigLIP) of the 4b, 12b and 27b vision-language models.

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
    vision: VisionConfig | None = None  # the image encoder of a vision-language model (4b and larger), None: text only

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


@dataclasses.dataclass(frozen=True, kw_only=True)
class VisionConfig:
    """Gemma 3's SigLIP image encoder and its soft tokens (Hugging Face's vision_config and mm_tokens_per_image;
    the defaults are those of 4b, 12b and 27b). An image [image_size, image_size, 3], normalised to [-1, 1] as
    the processor does, is cut into patches of patch_size pixels; the encoder's outputs are average-pooled to
    `soft_tokens` vectors, which the projector maps into the text embedding at the text's image tokens."""

    image_size: int = 896
    patch_size: int = 14
    width: int = 1152  # the encoder's hidden size
    depth: int = 27
    mlp_dim: int = 4304
    num_heads: int = 16
    soft_tokens: int = 256  # an image's tokens in the text
    image_token_id: int = 262_144  # the token a soft token takes the place of (past the text vocabulary)

    def __post_init__(self):
        side = self.image_size // self.patch_size
        pooled_side = round(self.soft_tokens**0.5)
        if self.image_size % self.patch_size or pooled_side**2 != self.soft_tokens or side % pooled_side:
            raise ValueError(f"a {self.image_size}-pixel image of {self.patch_size}-pixel patches does not pool to "
                             f"{self.soft_tokens} soft tokens (a square whose side divides the patches' side)")
        if self.width % self.num_heads:
            raise ValueError(f"width {self.width} must be a multiple of num_heads {self.num_heads}")

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def pooling(self) -> int:
        """The side of the square of patches one soft token averages."""
        return self.patches_per_side // round(self.soft_tokens**0.5)


SIGLIP = VisionConfig()


def tiny_vision(*, image_token_id: int) -> VisionConfig:
    """A SigLIP small enough for CPU tests: 56-pixel images, 16 patches pooled to 4 soft tokens."""
    return VisionConfig(image_size=56, patch_size=14, width=32, depth=2, mlp_dim=48, num_heads=2, soft_tokens=4,
                        image_token_id=image_token_id)
