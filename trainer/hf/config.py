"""A Gemma 3 text architecture (trainer.gemma3.config) as Hugging Face's `config.json` (Gemma3ForCausalLM), with
an image encoder (VisionConfig) Gemma3ForConditionalGeneration's, and the image encoder read back from one.

The keys are those of Google's published Gemma 3 text configs (rope_theta, rope_local_base_freq,
rope_scaling, layer_types), which transformers 4.5x reads as they are and transformers 5 converts
into its rope_parameters: a serving stack of either generation loads the export.
"""

from __future__ import annotations

from trainer.gemma3.config import Gemma3Config, VisionConfig


def model_config_json(config: Gemma3Config, *, dtype: str, bos_id: int, eos_id: int, pad_id: int) -> dict:
    """config.json of the text model; `dtype` the weights' (float32 | bfloat16)."""
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
        "hidden_activation": "gelu_pytorch_tanh",  # flax's nn.gelu is the tanh approximation
        "rms_norm_eps": 1e-6,
        "query_pre_attn_scalar": config.query_pre_attn_scalar,
        "sliding_window": config.sliding_window_size,
        "layer_types": [kind.value for kind in config.attention_types],
        "rope_theta": float(config.global_base_frequency),
        "rope_local_base_freq": float(config.local_base_frequency),
        "rope_scaling": rope_scaling,
        "final_logit_softcapping": config.final_logit_softcap,
        "attn_logit_softcapping": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": True,  # the loss head decodes with the input embedding
        "max_position_embeddings": 131_072 if config.global_scale_factor != 1.0 else 32_768,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "use_cache": True,
    }


# Gemma3TextConfig's defaults (transformers 4.5x and 5 alike), which a saved config may leave out: the
# text_config of Google's multimodal checkpoints lists only the keys that differ from them.
TEXT_DEFAULTS = {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "query_pre_attn_scalar": 256,
                 "sliding_window": 4096, "sliding_window_pattern": 6, "rope_theta": 1_000_000.0,
                 "rope_local_base_freq": 10_000.0, "rope_scaling": None, "final_logit_softcapping": None,
                 "hidden_activation": "gelu_pytorch_tanh"}


def architecture(text_config: dict) -> dict:
    """What decides the text model's computation, from a Gemma 3 text config.json of either transformers
    generation (4.5x: rope_theta, rope_local_base_freq, rope_scaling; 5: rope_parameters by layer type)."""
    config = {**TEXT_DEFAULTS, **text_config}
    layers = config["num_hidden_layers"]
    pattern = config.get("_sliding_window_pattern") or config["sliding_window_pattern"]
    layer_types = config.get("layer_types") or [
        "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)]
    rope = config.get("rope_parameters") or {
        "full_attention": {"rope_theta": config["rope_theta"], **(config["rope_scaling"] or {})},
        "sliding_attention": {"rope_theta": config["rope_local_base_freq"]},
    }
    softcap = config["final_logit_softcapping"]
    return {
        **{key: config[key] for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                        "num_key_value_heads", "head_dim", "hidden_activation")},
        "query_pre_attn_scalar": float(config["query_pre_attn_scalar"]),
        "sliding_window": config["sliding_window"],
        "layer_types": list(layer_types),
        "rope_theta": float(rope["full_attention"]["rope_theta"]),
        "rope_local_base_freq": float(rope["sliding_attention"]["rope_theta"]),
        "rope_scaling_factor": float(rope["full_attention"].get("factor") or 1.0),
        "final_logit_softcapping": None if softcap is None else float(softcap),
    }


def multimodal_config_json(text: dict, vision: VisionConfig) -> dict:
    """config.json of the vision-language model, around the text model's (model_config_json)."""
    return {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "torch_dtype": text["torch_dtype"],
        "text_config": {key: value for key, value in text.items() if key not in ("architectures", "torch_dtype")},
        "vision_config": {
            "model_type": "siglip_vision_model",
            "hidden_size": vision.width,
            "intermediate_size": vision.mlp_dim,
            "num_hidden_layers": vision.depth,
            "num_attention_heads": vision.num_heads,
            "image_size": vision.image_size,
            "patch_size": vision.patch_size,
            "num_channels": 3,
            "hidden_act": "gelu_pytorch_tanh",
            "layer_norm_eps": 1e-6,
            "vision_use_head": False,  # Gemma 3 reads the encoder's last hidden states
        },
        "mm_tokens_per_image": vision.soft_tokens,
        "image_token_index": vision.image_token_id,
        "tie_word_embeddings": True,
    }


# SiglipVisionConfig's defaults and Gemma3Config's (transformers 4.5x and 5 alike), which a saved config may leave out.
VISION_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
                   "image_size": 224, "patch_size": 16, "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6}
MULTIMODAL_DEFAULTS = {"mm_tokens_per_image": 256, "image_token_index": 262_144}


def vision_config(config: dict) -> VisionConfig:
    """The image encoder of a Gemma3ForConditionalGeneration config.json (transformers 4.5x or 5). Raises
    ValueError for one this trainer's encoder does not compute."""
    vision = {**VISION_DEFAULTS, **(config.get("vision_config") or {})}
    if vision["hidden_act"] != "gelu_pytorch_tanh" or float(vision["layer_norm_eps"]) != 1e-6:
        raise ValueError(f"vision_config's hidden_act {vision['hidden_act']!r} and layer_norm_eps {vision['layer_norm_eps']} "
                         "are not Gemma 3's (gelu_pytorch_tanh, 1e-06)")
    top = {**MULTIMODAL_DEFAULTS, **config}
    return VisionConfig(image_size=vision["image_size"], patch_size=vision["patch_size"], width=vision["hidden_size"],
                        depth=vision["num_hidden_layers"], mlp_dim=vision["intermediate_size"],
                        num_heads=vision["num_attention_heads"], soft_tokens=top["mm_tokens_per_image"],
                        image_token_id=config.get("image_token_id", top["image_token_index"]))
