"""Parameter count and training FLOPs per token, computed from a Gemma 3 architecture alone.

No model is built: the counts follow the parameter shapes of trainer.gemma3.model, and the tests
check them against an initialised model. Only the text decoder is
counted; the trainer builds its models text-only, without a vision encoder.
"""

from trainer.gemma3.config import Attention


def _attention_params(config) -> int:
    query = config.num_heads * config.embed_dim * config.head_dim
    key_value = 2 * config.num_kv_heads * config.embed_dim * config.head_dim
    output = config.num_heads * config.head_dim * config.embed_dim
    qk_norm = 2 * config.head_dim
    return query + key_value + output + qk_norm


def embedding_params(config) -> int:
    """The token embedding, tied with the output projection (unembedding)."""
    return config.num_embed * config.embed_dim


def layer_params(config) -> int:
    """Parameters of one transformer block (all blocks have the same shapes)."""
    feed_forward = 3 * config.embed_dim * config.hidden_dim  # gate and up (one gating einsum), down
    norms = 4  # RMSNorm scales of embed_dim: before and after attention and feed-forward
    return _attention_params(config) + feed_forward + norms * config.embed_dim


def param_count(config) -> int:
    """Parameters of the text model: embedding + blocks + final norm."""
    return embedding_params(config) + config.num_layers * layer_params(config) + config.embed_dim


def lora_param_count(config, rank: int) -> int:
    """Adapter parameters LoRA of `rank` adds: each projection weight of a block gets a [inputs, rank]
    and a [rank, outputs] factor (trainer.gemma3.model); the embedding gets none."""
    model, heads, kv_heads = config.embed_dim, config.num_heads, config.num_kv_heads
    head, hidden = config.head_dim, config.hidden_dim
    query_key_value = (model + heads * head) + (model + 2 * kv_heads * head)
    output = heads * head + model
    feed_forward = (model + 2 * hidden) + (hidden + model)
    return config.num_layers * rank * (query_key_value + output + feed_forward)


def trained_param_count(config, lora_rank: int) -> int:
    """The parameters a run trains: LoRA's adapters of `lora_rank`, or all of them (0: full fine-tune)."""
    return lora_param_count(config, lora_rank) if lora_rank else param_count(config)


def attention_context(attention_type, seq_len: int, sliding_window_size: int | None) -> float:
    """Mean number of keys a query attends to under the causal mask (and the sliding window)."""
    window = seq_len
    if attention_type is Attention.LOCAL and sliding_window_size:
        window = min(sliding_window_size, seq_len)
    # Positions 0..window-1 see 1..window keys; the later ones see `window` each.
    return (window * (window + 1) / 2 + (seq_len - window) * window) / seq_len


def training_flops_per_token(config, seq_len: int, *, lora_rank: int = 0) -> float:
    """FLOPs of one training step divided by the tokens in it, for rows of `seq_len` tokens.

    Matrix multiplies only, each 2 FLOPs per multiply-add: the forward pass costs 2 per
    parameter (the tied embedding counted once, as the unembedding; the lookup is free) plus the
    attention scores and the weighted sum, 2 * 2 * num_heads * head_dim per key attended; the
    backward pass costs twice the forward (gradients of activations and of weights). So a full
    fine-tune is 6N + 3 x attention. With LoRA (`lora_rank` > 0) the frozen weights get no
    gradient, so 4N + 3 x attention; the adapters (well under 1% of N) are left out. A causal
    query attends to the keys up to itself, and a sliding-window layer to at most its window.
    """
    weight_multiplier = 4 if lora_rank else 6
    attention_forward = sum(
        4 * config.num_heads * config.head_dim * attention_context(kind, seq_len, config.sliding_window_size)
        for kind in config.attention_types
    )
    return weight_multiplier * param_count(config) + 3 * attention_forward


def model_flops_utilization(
    tokens_per_sec_per_device: float, flops_per_token: float, peak_flops_per_device: float | None
) -> float | None:
    """The fraction of the chip's peak the model's arithmetic reaches (MFU), None when the peak is unknown."""
    if peak_flops_per_device is None:
        return None
    return tokens_per_sec_per_device * flops_per_token / peak_flops_per_device
