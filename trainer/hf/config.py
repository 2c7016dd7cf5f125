"""A Gemma 3 text model's gm TransformerConfig as Hugging Face's `config.json` (Gemma3ForCausalLM).

The keys are those of Google's published Gemma 3 text configs (rope_theta, rope_local_base_freq,
rope_scaling, layer_types), which transformers 4.5x reads as they are and transformers 5 converts
into its rope_parameters: a serving stack of either generation loads the export.
"""

from __future__ import annotations

from gemma import gm

_Norm = gm.nn.config.QueryPreAttentionNormalisation
_LAYER_TYPES = {gm.nn.AttentionType.LOCAL_SLIDING: "sliding_attention", gm.nn.AttentionType.GLOBAL: "full_attention"}
# What HF's Gemma 3 always has and gm makes optional: a config without them is not Gemma 3.
_GEMMA3_ONLY = ("use_post_attn_norm", "use_post_ffw_norm", "use_qk_norm")


def require_gemma3(config: gm.nn.config.TransformerConfig) -> None:
    """ValueError for a gm architecture that Gemma3ForCausalLM cannot express."""
    missing = [field for field in _GEMMA3_ONLY if not getattr(config, field)]
    if missing:
        raise ValueError(f"not a Gemma 3 architecture: {', '.join(missing)} off")
    if config.local_scale_factor != 1.0:
        raise ValueError(f"local_scale_factor {config.local_scale_factor}: Gemma 3 scales only the global RoPE")
    if config.attn_logits_soft_cap is not None:  # transformers' Gemma3Attention never applies attn_logit_softcapping
        raise ValueError(f"attn_logits_soft_cap {config.attn_logits_soft_cap}: Gemma 3 has no attention softcap")
    if config.num_heads == config.num_kv_heads:
        raise ValueError("num_heads == num_kv_heads: gm fuses q, k and v into qkv_einsum, which Gemma 3 never does")


def query_pre_attn_scalar(config: gm.nn.config.TransformerConfig) -> int:
    """HF scales queries by query_pre_attn_scalar ** -0.5; gm multiplies by config.query_pre_attn_scalar()."""
    match config.query_pre_attn_norm:
        case _Norm.BY_ONE_OVER_SQRT_HEAD_DIM:
            return config.head_dim
        case _Norm.BY_ONE_OVER_SQRT_EMBED_DIM_DIV_NUM_HEADS:
            return config.embed_dim // config.num_heads
    raise ValueError(f"query_pre_attn_norm {config.query_pre_attn_norm}: Gemma 3 scales queries by 1/sqrt(a size)")


def model_config_json(config: gm.nn.config.TransformerConfig, *, dtype: str, bos_id: int, eos_id: int, pad_id: int) -> dict:
    """config.json of the text model; `dtype` the weights' (float32 | bfloat16)."""
    require_gemma3(config)
    rope_scaling = None
    if config.global_scale_factor != 1.0:
        rope_scaling = {"rope_type": "linear", "factor": float(config.global_scale_factor)}
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "torch_dtype": dtype,
        "vocab_size": config.num_embed,
        "hidden_size": config.embed_dim,
        "intermediate_size": config.hidden_dim,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_activation": "gelu_pytorch_tanh",  # gm's nn.gelu is the tanh approximation
        "rms_norm_eps": 1e-6,
        "query_pre_attn_scalar": query_pre_attn_scalar(config),
        "sliding_window": config.sliding_window_size,
        "layer_types": [_LAYER_TYPES[kind] for kind in config.attention_types],
        "rope_theta": float(config.global_base_frequency),
        "rope_local_base_freq": float(config.local_base_frequency),
        "rope_scaling": rope_scaling,
        "final_logit_softcapping": config.final_logit_softcap,
        "attn_logit_softcapping": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": True,  # gm decodes with the input embedding
        "max_position_embeddings": 131_072 if config.global_scale_factor != 1.0 else 32_768,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "use_cache": True,
    }
