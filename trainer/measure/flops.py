"""Parameter count and training FLOPs per token, computed from a Gemma 3 architecture alone.

No model is built: the counts follow the parameter shapes of trainer.gemma3.model, and the tests
check them against an initialised model. A vision-language run's step also encodes its images
(trainer.gemma3.vision) and projects their soft tokens into the text: image_flops counts that, per image.

Attention is counted per token over the whole row (training_flops_per_token), or, from a batch's
segment ids, within each packed document (attention_flops): packed rows hold documents of a few
hundred tokens, so the row's count credits attention the step never did.
"""

import dataclasses

import numpy as np

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


def _window(attention_type, sliding_window_size: int | None) -> int | None:
    """The keys a query of this layer kind sees at most (None: all before it)."""
    return sliding_window_size if attention_type is Attention.LOCAL and sliding_window_size else None


def weight_flops_per_token(config, *, lora_rank: int = 0) -> float:
    """The matmuls with the weights, forward and backward (6N; 4N with LoRA): training_flops_per_token
    without attention."""
    return (4 if lora_rank else 6) * param_count(config)


def document_lengths(segment_ids) -> np.ndarray:
    """The lengths of the documents packed into rows of segment ids [B, L] (runs of one id; 0 is padding)."""
    segments = np.asarray(segment_ids)
    segments = segments.reshape(-1, segments.shape[-1])
    padded = np.pad(segments, ((0, 0), (1, 1)))  # a boundary before and after each row
    starts = np.flatnonzero((padded[:, 1:] != padded[:, :-1]).ravel())
    runs = np.diff(starts)
    first_ids = padded[:, 1:].ravel()[starts[:-1]]
    return runs[first_ids != 0]


def causal_pairs(lengths, window: int | None) -> float:
    """(query, key) pairs of causal attention within sequences of these lengths: a query at i sees i + 1
    keys, at most `window`."""
    lengths = np.asarray(lengths, np.float64)
    seen = lengths if window is None else np.minimum(lengths, window)
    return float(np.sum(seen * (seen + 1) / 2 + (lengths - seen) * seen))


@dataclasses.dataclass(frozen=True)
class AttentionFlops:
    """A batch's attention FLOPs in training (forward and backward, every layer): over the whole row, as
    training_flops_per_token counts them, and within each document, which is what packed rows compute
    usefully (the kernels skip the other documents' keys; the dense mask zeroes them)."""

    rows: float
    documents: float


def attention_flops(config, segment_ids) -> AttentionFlops:
    """AttentionFlops of rows of segment ids [B, L]: a query attends to the keys up to itself (in the
    row, or in its document), a sliding-window layer to at most its window; 4 x heads x head width FLOPs a
    pair forward, 3x that with the backward pass. Padding (segment 0) attends within no document."""
    segments = np.asarray(segment_ids)
    rows, seq_len = segments.reshape(-1, segments.shape[-1]).shape
    lengths = document_lengths(segments)
    per_pair = 3 * 4 * config.num_heads * config.head_dim
    windows = [_window(kind, config.sliding_window_size) for kind in config.attention_types]
    return AttentionFlops(rows=per_pair * rows * sum(causal_pairs([seq_len], window) for window in windows),
                          documents=per_pair * sum(causal_pairs(lengths, window) for window in windows))


def image_flops(vision, embed_dim: int, *, train_encoder: bool) -> float:
    """Training FLOPs of one image (matrix multiplies, 2 a multiply-add): the SigLIP encoder's patch embedding
    (the convolution: a patch's pixels by width), each block's q, k, v and output projections, feed-forward and
    attention (every patch sees every patch: 4 x width a pair), and the projector (soft tokens by width by
    embed_dim). Forward only for a frozen encoder (--vision-encoder frozen), while the projector, trained
    either way, adds its weights' gradient but none for its input (2x). A trained encoder's backward is twice
    its forward (3x), but the patch embedding's, whose input is pixels (2x)."""
    patches, width = vision.patches_per_side**2, vision.width
    patch_embedding = 2 * patches * vision.patch_size**2 * 3 * width
    block = patches * (2 * 4 * width * width + 2 * 2 * width * vision.mlp_dim + 4 * patches * width)
    projector = 2 * vision.soft_tokens * width * embed_dim
    if train_encoder:
        return 2 * patch_embedding + 3 * vision.depth * block + 3 * projector
    return patch_embedding + vision.depth * block + 2 * projector


def training_flops_per_token(config, seq_len: int, *, lora_rank: int = 0, images_per_row: int = 0,
                             train_encoder: bool = False) -> float:
    """FLOPs of one training step divided by the tokens in it, for rows of `seq_len` tokens.

    Matrix multiplies only, each 2 FLOPs per multiply-add: the forward pass costs 2 per
    parameter (the tied embedding counted once, as the unembedding; the lookup is free) plus the
    attention scores and the weighted sum, 2 * 2 * num_heads * head_dim per key attended; the
    backward pass costs twice the forward (gradients of activations and of weights). So a full
    fine-tune is 6N + 3 x attention. With LoRA (`lora_rank` > 0) the frozen weights get no
    gradient, so 4N + 3 x attention; the adapters (well under 1% of N) are left out. A causal
    query attends to the keys up to itself, and a sliding-window layer to at most its window.
    A vision-language model's rows of `images_per_row` images add their image_flops, per token of the row.
    """
    attention_forward = sum(
        4 * config.num_heads * config.head_dim * attention_context(kind, seq_len, config.sliding_window_size)
        for kind in config.attention_types
    )
    images = image_flops_per_token(config, seq_len, images_per_row=images_per_row, train_encoder=train_encoder)
    return weight_flops_per_token(config, lora_rank=lora_rank) + 3 * attention_forward + images


def image_flops_per_token(config, seq_len: int, *, images_per_row: int, train_encoder: bool) -> float:
    """A row's image_flops (`images_per_row` images) per token of the row; 0 for a text model."""
    if config.vision is None:
        return 0.0
    return images_per_row * image_flops(config.vision, config.embed_dim, train_encoder=train_encoder) / seq_len


def model_flops_utilization(
    tokens_per_sec_per_device: float, flops_per_token: float, peak_flops_per_device: float | None
) -> float | None:
    """The fraction of the chip's peak the model's arithmetic reaches (MFU), None when the peak is unknown."""
    if peak_flops_per_device is None:
        return None
    return tokens_per_sec_per_device * flops_per_token / peak_flops_per_device
