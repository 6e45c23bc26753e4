#!/bin/bash
# Must-show rows for issue 3, sixteenth session (same Zen 3 host kind, 2 vCPUs, AVX2), after
# the K-quant weight prefetch spread over each super-block (vnni_blocks.K_AHEAD): the rows
# of the models with Q4_K / Q6_K weights (Qwen2.5-0.5B: 18 % of its bytes; Qwen2.5-1.5B:
# all), at 2 and 1 thread, then the matmul assembly and the overlap curve with the kernels
# placed on it.  SmolLM2 (Q4_1 + Q8_0, untouched kernels) keeps its bench-2026-12-01h rows.
cd /work/main
. .venv/bin/activate
D=2026-12-01i
R=perf/results
set -x
llcinfer generate -m qwen2.5-coder-0.5b --temp 0 -n 4 "warm the caches" > $R/warmup-$D.log 2>&1
llcinfer bench -m qwen2.5-coder-0.5b --threads 2 -p 512 -n 128 --depth 0,4096 -r 4 --vs llama.cpp --fill-limit 600 --json $R/bench-$D-qwen0.5b.json > $R/bench-$D-qwen0.5b.md 2> $R/bench-$D-qwen0.5b.log
llcinfer bench -m qwen2.5-coder-0.5b --threads 1 -p 0 -n 64 --depth 0,4096 -r 3 --vs llama.cpp --fill synthetic --json $R/bench-$D-t1-qwen0.5b.json > $R/bench-$D-t1-qwen0.5b.md 2> $R/bench-$D-t1-qwen0.5b.log
llcinfer bench -m qwen2.5-coder-0.5b --threads 2 -p 0 -n 128 --depth 16384 -r 3 --vs llama.cpp --alternate block --fill synthetic --json $R/bench-$D-qwen0.5b-d16384.json > $R/bench-$D-qwen0.5b-d16384.md 2> $R/bench-$D-qwen0.5b-d16384.log
llcinfer bench -m qwen2.5-coder-0.5b --threads 1 -p 0 -n 32 --depth 16384 -r 3 --vs llama.cpp --alternate block --fill synthetic --json $R/bench-$D-t1-qwen0.5b-d16384.json > $R/bench-$D-t1-qwen0.5b-d16384.md 2> $R/bench-$D-t1-qwen0.5b-d16384.log
llcinfer bench -m qwen2.5-coder-1.5b --threads 2 -p 512 -n 128 --depth 0 -r 5 --vs llama.cpp --json $R/bench-$D-qwen1.5b.json > $R/bench-$D-qwen1.5b.md 2> $R/bench-$D-qwen1.5b.log
llcinfer bench -m qwen2.5-coder-1.5b --threads 1 -p 0 -n 64 --depth 0 -r 4 --vs llama.cpp --json $R/bench-$D-t1-qwen1.5b.json > $R/bench-$D-t1-qwen1.5b.md 2> $R/bench-$D-t1-qwen1.5b.log
python perf/bench_report.py $R/bench-2026-12-01h-{smollm2-135m,t1-smollm2-135m}.json $R/bench-$D-{qwen0.5b,t1-qwen0.5b,qwen0.5b-d16384,t1-qwen0.5b-d16384,qwen1.5b,t1-qwen1.5b}.json --json $R/bench-$D.json --plot $R/bench-$D.png > $R/bench-$D.md 2>&1
python perf/kernel_asm.py --isa avx2 > $R/asm-$D-matmul.json 2> $R/asm-$D-matmul.log
python perf/overlap_ceiling.py --threads 1 2 --fmas 0 1 2 3 4 --ahead 0 1024 4096 --reps 9 --kernels --json $R/overlap-$D.json > $R/overlap-$D.log 2>&1
echo MUSTSHOW_DONE
