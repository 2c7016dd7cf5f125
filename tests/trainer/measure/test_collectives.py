"""The ICI bytes of a compiled program, read from its HLO: what each kind of collective counts."""

from trainer.measure.collectives import collective_bytes

GATHER = ("  %all-gather.11 = bf16[512,128]{1,0:T(8,128)(2,1)S(1)} all-gather(%convert.1), channel_id=22, "
          "replica_groups=mesh['data'=1,'fsdp'=4] {'fsdp'}, dimensions={0}")
SCATTER = ("  %reduce-scatter.2 = f32[128,128]{1,0} reduce-scatter(%fusion.3), channel_id=5, "
           "replica_groups=mesh['data'=2,'fsdp'=4] {'fsdp'}, dimensions={0}")
REDUCE = "  %all-reduce.80 = (f32[]{:T(128)}, bf16[4,32]{1,0}) all-reduce(%a, %b), channel_id=43, replica_groups={{0,1,2,3}}"
ASYNC = ("  %all-gather-start = (bf16[128]{0}, bf16[512]{0}) all-gather-start(%p), replica_groups={{0,1,2,3}}\n"
         "  %all-gather-done = bf16[512]{0} all-gather-done(%all-gather-start)")


def test_each_collective_counts_the_arrays_it_moves_per_chip():
    assert collective_bytes(GATHER) == 512 * 128 * 2  # the gathered result
    assert collective_bytes(SCATTER) == 128 * 128 * 4 * 4  # the full operand: the result times the fsdp group
    assert collective_bytes(REDUCE) == 2 * (4 + 4 * 32 * 2)  # reduce-scatter and all-gather halves
    assert collective_bytes(ASYNC) == 512 * 2  # the pair once, at -done
    assert collective_bytes("\n".join([GATHER, SCATTER, "  %add = f32[8] add(%x, %y)"])) == 512 * 128 * 2 + 128 * 128 * 16
