#!/bin/bash
# Must-show runs for issue 3 after the vector rope + KV append, the weight-region warm-up
# before each matmul's wait, and the bench's probe next to every repetition: the same
# commands as mustshow-2026-11-30-kt.sh, results named 2026-11-30-rope; one after the other
# on an otherwise idle 2-vCPU host (shared with other tenants).
exec bash "$(dirname "$0")/mustshow-2026-11-30-kt.sh" 2026-11-30-rope
