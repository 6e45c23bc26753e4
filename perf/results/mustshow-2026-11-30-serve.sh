#!/bin/bash
# Must-show runs for issue 3 after the numba serve loop for the worker threads and the
# head-major f16 KV pool (on top of transposed-K attention, huge pages, vector SwiGLU): the
# same commands as mustshow-2026-11-30-kt.sh, results named 2026-11-30-serve; one after
# the other on an otherwise idle 2-vCPU host (the host itself is shared with other tenants).
exec bash "$(dirname "$0")/mustshow-2026-11-30-kt.sh" 2026-11-30-serve
