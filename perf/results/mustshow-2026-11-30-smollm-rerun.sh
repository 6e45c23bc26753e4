#!/bin/bash
# SmolLM2 again: its first run (04:42) predates the VNNI matmul and paged KV cache commits.
cd /work/main
while kill -0 3842 2>/dev/null; do sleep 10; done
set -x
llcinfer bench -m smollm2-135m --threads 2 -p 512 -n 128 --depth 0,4096,8192 -r 3 --vs llama.cpp --fill-limit 600 --json perf/results/bench-2026-11-30-smollm2-135m-rerun.json > perf/results/bench-2026-11-30-smollm2-135m-rerun.md 2> perf/results/bench-2026-11-30-smollm2-135m-rerun.log
echo ALLDONE
