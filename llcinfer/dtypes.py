"""The storage types every room names, as the integer codes the kernels switch on.

GGML tensor types are gguf.GGMLQuantizationType's values; activation kinds say what a
matmul input is rounded to (llama.cpp's vec_dot_type of the weight type); KV kinds are
the KV pool's storage types (kv/pool.py holds the layouts).
"""

# GGML tensor types
F32, F16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K, BF16 = 0, 1, 2, 3, 6, 8, 12, 14, 30
QUANT_BLOCK = {Q4_0: (32, 18), Q4_1: (32, 20), Q5_0: (32, 22), Q8_0: (32, 34), Q4_K: (256, 144),
               Q6_K: (256, 210)}  # block-quantized type -> (values, bytes) per block

# activation kinds
ACT_F32, ACT_Q8_0, ACT_Q8_K, ACT_F16, ACT_BF16 = 0, 1, 2, 3, 4
ACT_KIND = {Q4_0: ACT_Q8_0, Q4_1: ACT_Q8_0, Q5_0: ACT_Q8_0, Q8_0: ACT_Q8_0, Q4_K: ACT_Q8_K, Q6_K: ACT_Q8_K,
            F16: ACT_F16, BF16: ACT_BF16, F32: ACT_F32}  # weight type -> what its input is rounded to

# KV cache storage kinds
KV_F32, KV_F16, KV_INT8 = 0, 1, 2
KV_KINDS = {"f32": KV_F32, "f16": KV_F16, "int8": KV_INT8}
