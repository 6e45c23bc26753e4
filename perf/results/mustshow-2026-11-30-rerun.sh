#!/bin/bash
# Re-run of the must-show table after fixing the comparison: llama-bench had inherited
# OMP_WAIT_POLICY=PASSIVE from our process (3x slower llama.cpp decode).
cd /work/main
D=2026-11-30
set -x
llcinfer bench -m smollm2-135m --threads 2 -p 512 -n 128 --depth 0,4096,8192 -r 3 --vs llama.cpp --fill-limit 600 --json perf/results/bench-$D-smollm2-135m.json > perf/results/bench-$D-smollm2-135m.md 2> perf/results/bench-$D-smollm2-135m.log
llcinfer bench -m qwen2.5-coder-0.5b --threads 2 -p 512 -n 128 --depth 0,4096 -r 3 --vs llama.cpp --fill-limit 600 --json perf/results/bench-$D-qwen0.5b.json > perf/results/bench-$D-qwen0.5b.md 2> perf/results/bench-$D-qwen0.5b.log
llcinfer bench -m qwen2.5-coder-1.5b --threads 2 -p 512 -n 128 --depth 0,4096 -r 3 --vs llama.cpp --alternate block --fill-limit 600 --json perf/results/bench-$D-qwen1.5b.json > perf/results/bench-$D-qwen1.5b.md 2> perf/results/bench-$D-qwen1.5b.log
llcinfer bench -m qwen2.5-coder-0.5b --threads 2 -p 0 -n 128 --depth 16384 -r 3 --vs llama.cpp --alternate block --fill synthetic --json perf/results/bench-$D-qwen0.5b-d16384.json > perf/results/bench-$D-qwen0.5b-d16384.md 2> perf/results/bench-$D-qwen0.5b-d16384.log
python perf/bench_report.py perf/results/bench-$D-{smollm2-135m,qwen0.5b,qwen0.5b-d16384,qwen1.5b}.json --json perf/results/bench-$D.json --plot perf/results/bench-$D.png
