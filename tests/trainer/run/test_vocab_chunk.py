"""--vocab-chunk auto on TPU: the loss head is compiled for each candidate chunk and ranked by the
compiler's figures (every loop iteration counted); a step the compiler refuses moves on only to a
chunk whose head frees the bytes it was short of. Off TPU the size rule decides, with no compile."""

import jax.numpy as jnp
import pytest

from trainer.nn import loss
from trainer.run import mesh, step, vocab_chunk
from trainer.config import parse_config
from trainer.errors import UserError

TOKENS, EMBED, VOCAB = 8 * 256, 128, 8192


@pytest.fixture(scope="module")
def heads():
    pytest.importorskip("libtpu", reason="libtpu is in requirements-dev.lock: run `make setup`")
    from trainer.measure import compiled

    device_mesh = mesh.build_mesh({"data": -1, "fsdp": 1}, slices=1, devices=compiled.tpu_devices("v6e", "2x2"))
    return vocab_chunk.ranked(device_mesh, jnp.bfloat16, tokens=TOKENS, embed_dim=EMBED, vocab_size=VOCAB, softcap=30.0)


def test_candidates_are_plain_logits_and_the_chunks_below_the_vocabulary():
    assert vocab_chunk.candidates(VOCAB) == (None, 4096)
    assert vocab_chunk.candidates(262_144) == (None, 65_536, 32_768, 16_384, 8_192, 4_096)
    assert vocab_chunk.candidates(512) == (None,)


def test_heads_are_ranked_by_the_compilers_roofline_with_every_iteration_counted(heads):
    assert [head.chunk for head in heads] == [None, 4096]  # plain logits: fewest bytes, when they fit
    assert list(heads) == sorted(heads, key=lambda head: head.roofline_s)
    plain, chunked = heads
    multiply_adds = TOKENS / 4 * VOCAB * EMBED  # per chip
    # Plain: logits, and the gradients of hidden states and embedding: 3 matmuls of 2 FLOPs a multiply-add.
    assert plain.flops == pytest.approx(6 * multiply_adds, rel=0.1)
    # Chunked: the fused head's loop over token chunks takes the same three matmuls (a head chunked over the
    # vocabulary recomputed the logits in its backward: 8). The compiler saw one of the two iterations;
    # without the correction this would be about half.
    assert chunked.flops == pytest.approx(6 * multiply_adds, rel=0.1)
    assert chunked.bytes_accessed > plain.bytes_accessed > 0


def test_a_head_the_compiler_refuses_alone_is_no_candidate(heads):
    """[2^19 tokens, 8192] float32 logits are 16 GiB, over the 15.75 a v5e chip allows: on one chip only
    the chunked head is left (on four v6e chips, 2^11 tokens, both fit: the `heads` above)."""
    from trainer.measure import compiled

    one_chip = mesh.build_mesh({"data": -1, "fsdp": 1}, slices=1, devices=compiled.tpu_devices("v5e", "1x1"))
    left = vocab_chunk.ranked(one_chip, jnp.bfloat16, tokens=2**19, embed_dim=EMBED, vocab_size=VOCAB, softcap=30.0)
    assert [head.chunk for head in left] == [4096]


def test_a_refused_step_tries_only_chunks_that_free_what_it_was_short_of(heads):
    plain, chunked = heads
    freed = plain.temporaries - chunked.temporaries
    assert step.frees_enough(plain, None, 0)  # nothing refused yet
    assert step.frees_enough(chunked, plain, short=freed)
    assert not step.frees_enough(chunked, plain, short=freed + 1)


@pytest.mark.parametrize(("flag", "expected"), [("auto", None), ("none", None), ("1024", 1024)])
def test_off_tpu_the_chunk_needs_no_compiler(flag, expected):
    config = parse_config(["--preset", "tiny", "--vocab-chunk", flag])
    assert vocab_chunk.fixed(config.vocab_chunk, tokens_per_chip=2048, vocab_size=VOCAB) == expected
    # auto's size rule: chunks once [tokens, vocab] logits pass 2^26 elements.
    assert vocab_chunk.fixed("auto", tokens_per_chip=2**14, vocab_size=262_144) == loss.VOCAB_CHUNK


@pytest.mark.parametrize("flag", ["0", "-5", "half"])
def test_a_bad_vocab_chunk_is_one_line(flag):
    with pytest.raises(UserError, match="argument --vocab-chunk: expected auto, none or a positive number"):
        parse_config(["--preset", "tiny", "--vocab-chunk", flag])
