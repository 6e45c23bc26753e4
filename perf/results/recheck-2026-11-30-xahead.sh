#!/bin/bash
# Recheck of the Qwen2.5-Coder-0.5B d4096 row at 2 threads after mustshow-2026-11-30-xahead.sh
# met the host in its slow state on all 4 repetitions (probe 28-34 GB/s): 6 repetitions.
cd /work/main
R=perf/results
D=2026-11-30-xahead-recheck
set -x
llcinfer bench -m qwen2.5-coder-0.5b --threads 2 -p 0 -n 128 --depth 4096 -r 6 --vs llama.cpp --fill synthetic --json $R/bench-$D-qwen0.5b-t2.json > $R/bench-$D-qwen0.5b-t2.md 2> $R/bench-$D-qwen0.5b-t2.log
echo ALLDONE
