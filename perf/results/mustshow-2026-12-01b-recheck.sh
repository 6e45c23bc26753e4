#!/bin/bash
# Recheck of the three rows of bench-2026-12-01b that missed their ratio targets (same
# commands and engine, run once more right after): Qwen-0.5B d4096 at 2 and 1 threads,
# Qwen-1.5B d0 at 1 thread.
cd /work/main
D=2026-12-01b-recheck
R=perf/results
set -x
llcinfer bench -m qwen2.5-coder-0.5b --threads 2 -p 0 -n 128 --depth 4096 -r 4 --vs llama.cpp --fill synthetic --json $R/bench-$D-qwen0.5b.json > $R/bench-$D-qwen0.5b.md 2> $R/bench-$D-qwen0.5b.log
llcinfer bench -m qwen2.5-coder-0.5b --threads 1 -p 0 -n 64 --depth 4096 -r 3 --vs llama.cpp --fill synthetic --json $R/bench-$D-t1-qwen0.5b.json > $R/bench-$D-t1-qwen0.5b.md 2> $R/bench-$D-t1-qwen0.5b.log
llcinfer bench -m qwen2.5-coder-1.5b --threads 1 -p 0 -n 64 --depth 0 -r 4 --vs llama.cpp --json $R/bench-$D-t1-qwen1.5b.json > $R/bench-$D-t1-qwen1.5b.md 2> $R/bench-$D-t1-qwen1.5b.log
python perf/bench_report.py $R/bench-$D-{qwen0.5b,t1-qwen0.5b,t1-qwen1.5b}.json --json $R/bench-$D.json > $R/bench-$D.md 2>&1
echo ALLDONE
