#!/bin/bash
# Recheck of the two Qwen2.5-Coder-0.5B d4096 rows of bench-2026-11-30-rope (2 threads:
# 0.354, 1 thread: 0.362) with more repetitions, right after that run, same code.
cd /work/main
R=perf/results
D=2026-11-30-rope-recheck
set -x
llcinfer bench -m qwen2.5-coder-0.5b --threads 2 -p 0 -n 128 --depth 4096 -r 6 --vs llama.cpp --fill-limit 600 --json $R/bench-$D-qwen0.5b-t2.json > $R/bench-$D-qwen0.5b-t2.md 2> $R/bench-$D-qwen0.5b-t2.log
llcinfer bench -m qwen2.5-coder-0.5b --threads 1 -p 0 -n 64 --depth 4096 -r 5 --vs llama.cpp --fill synthetic --json $R/bench-$D-qwen0.5b-t1.json > $R/bench-$D-qwen0.5b-t1.md 2> $R/bench-$D-qwen0.5b-t1.log
echo ALLDONE
