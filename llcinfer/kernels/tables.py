"""Lookup tables shared by kernels: half-precision bit patterns to float32.

numba has no scalar f16/bf16 bitcast, so kernels read a 2-byte field as an integer and
index these 256 KiB tables (they stay in L2).
"""

import numpy as np

F16_TO_F32 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)  # [65536]
BF16_TO_F32 = (np.arange(65536, dtype=np.uint32) << 16).view(np.float32).copy()  # [65536]
