#!/bin/bash
# Must-show runs for issue 3 after transposed-K attention with spread prefetch, huge pages
# for weights and KV, vector SwiGLU and the step-overhead fixes; one after the other on an
# otherwise idle 2-vCPU host (the host itself is shared with other tenants).
cd /work/main
D=${1:-2026-11-30-kt}  # results name: the argument (mustshow-2026-11-30-serve.sh passes its own)
R=perf/results
set -x
llcinfer bench -m smollm2-135m --threads 2 -p 512 -n 128 --depth 0,4096,8000 -r 4 --vs llama.cpp --fill-limit 600 --json $R/bench-$D-smollm2-135m.json > $R/bench-$D-smollm2-135m.md 2> $R/bench-$D-smollm2-135m.log
llcinfer bench -m qwen2.5-coder-0.5b --threads 2 -p 512 -n 128 --depth 0,4096 -r 4 --vs llama.cpp --fill-limit 600 --json $R/bench-$D-qwen0.5b.json > $R/bench-$D-qwen0.5b.md 2> $R/bench-$D-qwen0.5b.log
llcinfer bench -m qwen2.5-coder-0.5b --threads 2 -p 0 -n 128 --depth 16384 -r 3 --vs llama.cpp --alternate block --fill synthetic --json $R/bench-$D-qwen0.5b-d16384.json > $R/bench-$D-qwen0.5b-d16384.md 2> $R/bench-$D-qwen0.5b-d16384.log
llcinfer bench -m qwen2.5-coder-1.5b --threads 2 -p 512 -n 128 --depth 0 -r 5 --vs llama.cpp --json $R/bench-$D-qwen1.5b.json > $R/bench-$D-qwen1.5b.md 2> $R/bench-$D-qwen1.5b.log
llcinfer bench -m smollm2-135m --threads 1 -p 0 -n 64 --depth 0,4096,8000 -r 3 --vs llama.cpp --fill synthetic --json $R/bench-$D-t1-smollm2-135m.json > $R/bench-$D-t1-smollm2-135m.md 2> $R/bench-$D-t1-smollm2-135m.log
llcinfer bench -m qwen2.5-coder-0.5b --threads 1 -p 0 -n 64 --depth 0,4096 -r 3 --vs llama.cpp --fill synthetic --json $R/bench-$D-t1-qwen0.5b.json > $R/bench-$D-t1-qwen0.5b.md 2> $R/bench-$D-t1-qwen0.5b.log
llcinfer bench -m qwen2.5-coder-1.5b --threads 1 -p 0 -n 64 --depth 0 -r 4 --vs llama.cpp --json $R/bench-$D-t1-qwen1.5b.json > $R/bench-$D-t1-qwen1.5b.md 2> $R/bench-$D-t1-qwen1.5b.log
python perf/bench_report.py $R/bench-$D-{smollm2-135m,qwen0.5b,qwen0.5b-d16384,qwen1.5b,t1-smollm2-135m,t1-qwen0.5b,t1-qwen1.5b}.json --json $R/bench-$D.json --plot $R/bench-$D.png > $R/bench-$D.md 2>&1
echo ALLDONE
