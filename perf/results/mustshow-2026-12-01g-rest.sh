#!/bin/bash
# The rest of the must-show rows for the fourteenth session (after mustshow-2026-12-01g.sh,
# same tree a8d1abc): SmolLM2 at 2 threads, the long contexts, the 1.5B, then the assembly,
# kernel microbenchmarks and start-up.  One after the other on an otherwise idle host.
cd /work/main
. .venv/bin/activate
D=2026-12-01g
R=perf/results
set -x
llcinfer bench -m smollm2-135m --threads 2 -p 512 -n 128 --depth 0,4096,8000 -r 4 --vs llama.cpp --fill-limit 600 --json $R/bench-$D-smollm2-135m.json > $R/bench-$D-smollm2-135m.md 2> $R/bench-$D-smollm2-135m.log
llcinfer bench -m qwen2.5-coder-0.5b --threads 2 -p 0 -n 128 --depth 16384 -r 3 --vs llama.cpp --alternate block --fill synthetic --json $R/bench-$D-qwen0.5b-d16384.json > $R/bench-$D-qwen0.5b-d16384.md 2> $R/bench-$D-qwen0.5b-d16384.log
llcinfer bench -m qwen2.5-coder-1.5b --threads 2 -p 512 -n 128 --depth 0 -r 5 --vs llama.cpp --json $R/bench-$D-qwen1.5b.json > $R/bench-$D-qwen1.5b.md 2> $R/bench-$D-qwen1.5b.log
llcinfer bench -m smollm2-135m --threads 1 -p 0 -n 64 --depth 8000 -r 3 --vs llama.cpp --fill synthetic --json $R/bench-$D-t1-smollm2-135m-d8000.json > $R/bench-$D-t1-smollm2-135m-d8000.md 2> $R/bench-$D-t1-smollm2-135m-d8000.log
llcinfer bench -m qwen2.5-coder-0.5b --threads 1 -p 0 -n 32 --depth 16384 -r 3 --vs llama.cpp --alternate block --fill synthetic --json $R/bench-$D-t1-qwen0.5b-d16384.json > $R/bench-$D-t1-qwen0.5b-d16384.md 2> $R/bench-$D-t1-qwen0.5b-d16384.log
llcinfer bench -m qwen2.5-coder-1.5b --threads 1 -p 0 -n 64 --depth 0 -r 4 --vs llama.cpp --json $R/bench-$D-t1-qwen1.5b.json > $R/bench-$D-t1-qwen1.5b.md 2> $R/bench-$D-t1-qwen1.5b.log
python perf/bench_report.py $R/bench-$D-{smollm2-135m,qwen0.5b,qwen0.5b-d16384,qwen1.5b,t1-smollm2-135m,t1-smollm2-135m-d8000,t1-qwen0.5b,t1-qwen0.5b-d16384,t1-qwen1.5b}.json --json $R/bench-$D.json --plot $R/bench-$D.png > $R/bench-$D.md 2>&1
python perf/kernel_asm.py --isa avx2 > $R/asm-$D-matmul.json 2> $R/asm-$D-matmul.log
python perf/attention_bench.py --ctx 4096 --threads 1 2 --isa avx2 --reps 5 --json $R/attention-$D.json > $R/attention-$D.log 2>&1
python perf/kernel_bench.py --isa avx2 --threads 1 2 --json $R/kernels-$D.json > $R/kernels-$D.log 2>&1
python perf/startup.py --warm-runs 3 --threads 2 --no-baseline --json $R/startup-$D.json > $R/startup-$D.log 2>&1
echo MUSTSHOW_DONE
