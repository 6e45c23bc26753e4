#!/bin/bash
# Must-show runs for issue 3, eleventh session, on a new kind of host: AMD EPYC (Zen 3) with
# AVX2 only (no AVX-512, no VNNI), so every kernel takes its avx2 path, and llama.cpp's
# native build is an AVX2 build.  Kernels: the AVX2 matmul with i16 partial sums and
# per-type block loops (commit 697efd1).  The TPOT table first (the kt script's commands),
# then start-up, the assembly evidence and the kernel / attention microbenchmarks.
cd /work/main
D=2026-12-01d
R=perf/results
set -x
bash "$(dirname "$0")/mustshow-2026-11-30-kt.sh" $D
python perf/startup.py --warm-runs 3 --threads 2 --no-baseline --json $R/startup-$D.json > $R/startup-$D.log 2>&1
python perf/kernel_asm.py --isa avx2 > $R/asm-$D-matmul.json 2> $R/asm-$D-matmul.log
python perf/kernel_bench.py --isa avx2 --threads 1 2 --json $R/kernels-$D.json > $R/kernels-$D.log 2>&1
python perf/attention_bench.py --ctx 4096 16384 --threads 1 2 --isa avx2 --reps 5 --json $R/attention-$D.json > $R/attention-$D.log 2>&1
echo MUSTSHOW_DONE
