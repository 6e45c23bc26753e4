#!/bin/bash
# Must-show runs for issue 3, thirteenth session, same kind of host as the twelfth (AMD EPYC
# Zen 3, 2 vCPUs, AVX2 only): the engine with Q8_0 dotted by the sign trick on AVX2 and the
# Q5_0 five-vector layout (repack FORMAT_VERSION 2, so the first run rebuilds the repack
# caches).  The TPOT table first (the kt script's commands, then the one cell it leaves
# out), then the matmul assembly and kernel microbenchmarks (both changed), start-up.
# Attention is unchanged since 81c8514 (attention-2026-12-01e.json).
cd /work/main
. .venv/bin/activate
D=2026-12-01f
R=perf/results
set -x
for m in smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b; do  # compile and repack once for this tree
  llcinfer generate -m $m --temp 0 -n 4 "warm the caches" >> $R/warmup-$D.log 2>&1
done
bash "$(dirname "$0")/mustshow-2026-11-30-kt.sh" $D
llcinfer bench -m qwen2.5-coder-0.5b --threads 1 -p 0 -n 32 --depth 16384 -r 3 --vs llama.cpp --alternate block --fill synthetic --json $R/bench-$D-t1-qwen0.5b-d16384.json > $R/bench-$D-t1-qwen0.5b-d16384.md 2> $R/bench-$D-t1-qwen0.5b-d16384.log
python perf/bench_report.py $R/bench-$D-{smollm2-135m,qwen0.5b,qwen0.5b-d16384,qwen1.5b,t1-smollm2-135m,t1-qwen0.5b,t1-qwen0.5b-d16384,t1-qwen1.5b}.json --json $R/bench-$D.json --plot $R/bench-$D.png > $R/bench-$D.md 2>&1
python perf/kernel_asm.py --isa avx2 > $R/asm-$D-matmul.json 2> $R/asm-$D-matmul.log
python perf/kernel_bench.py --isa avx2 --threads 1 2 --json $R/kernels-$D.json > $R/kernels-$D.log 2>&1
python perf/startup.py --warm-runs 3 --threads 2 --no-baseline --json $R/startup-$D.json > $R/startup-$D.log 2>&1
echo MUSTSHOW_DONE
