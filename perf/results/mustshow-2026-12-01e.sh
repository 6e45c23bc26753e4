#!/bin/bash
# Must-show runs for issue 3, twelfth session, on the same kind of host as the eleventh
# (AMD EPYC Zen 3, 2 vCPUs, AVX2 only): the engine at 81c8514 (decode attention with two
# key vectors per broadcast query value and P V in groups of 4 heads over 2 V vectors).
# The TPOT table first (the kt script's commands), then start-up and the attention
# microbenchmark with its assembly counts.  The matmul kernels and their assembly are
# unchanged since 627c2a9 (asm-2026-12-01d-matmul.json, kernels-2026-12-01d.json).
cd /work/main
. .venv/bin/activate
D=2026-12-01e
R=perf/results
set -x
llcinfer generate -m smollm2-135m -p "warm the kernel cache" -n 4 > $R/warmup-$D.log 2>&1  # compile once for this source tree
bash "$(dirname "$0")/mustshow-2026-11-30-kt.sh" $D
python perf/startup.py --warm-runs 3 --threads 2 --no-baseline --json $R/startup-$D.json > $R/startup-$D.log 2>&1
python perf/attention_bench.py --ctx 4096 16384 --threads 1 2 --isa avx2 --reps 5 --json $R/attention-$D.json > $R/attention-$D.log 2>&1
# run after the rest (the one cell the kt script leaves out): Qwen-0.5B d16384 at 1 thread
llcinfer bench -m qwen2.5-coder-0.5b --threads 1 -p 0 -n 32 --depth 16384 -r 3 --vs llama.cpp --alternate block --fill synthetic --json $R/bench-$D-t1-qwen0.5b-d16384.json > $R/bench-$D-t1-qwen0.5b-d16384.md 2> $R/bench-$D-t1-qwen0.5b-d16384.log
echo MUSTSHOW_DONE
