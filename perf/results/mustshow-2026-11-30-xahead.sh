#!/bin/bash
# Must-show runs for issue 3 after the L1 prefetch of the next block's activations in the
# one-row Q4_K / Q6_K matmul loops: the same commands as mustshow-2026-11-30-kt.sh, results
# named 2026-11-30-xahead; one after the other on an otherwise idle 2-vCPU host (shared
# with other tenants).
exec bash "$(dirname "$0")/mustshow-2026-11-30-kt.sh" 2026-11-30-xahead
