"""The model's layers as the step runs them, below the Gemma 3 modules that use them: packed attention
(splash on TPU, our FlashAttention kernels on GPU, dense on CPU), rematerialisation, FSDP's split and
gather of a weight, the chunked loss head, the compute dtype. Imports trainer's top (errors) only:
nothing of gemma3, model, run or what drives a run.
"""
