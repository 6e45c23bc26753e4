#!/bin/bash
# Must-show rows for issue 3, fifteenth session, after the commit "AVX2 P V groups of
# 4 heads also take 3 V vectors per pass": the Qwen2.5-0.5B rows (its 4 + 3 head groups are
# what that commit changes) at 2 and 1 thread, then the attention benchmark again.  The
# SmolLM2 rows (mustshow-2026-12-01h.sh) ran on the tree before it, whose SmolLM2 path is
# the same (3 heads: 3 V vectors per pass in both).
cd /work/main
. .venv/bin/activate
D=2026-12-01h
R=perf/results
set -x
llcinfer generate -m qwen2.5-coder-0.5b --temp 0 -n 4 "warm the caches" > $R/warmup-$D-qwen.log 2>&1
llcinfer bench -m qwen2.5-coder-0.5b --threads 2 -p 512 -n 128 --depth 0,4096 -r 4 --vs llama.cpp --fill-limit 600 --json $R/bench-$D-qwen0.5b.json > $R/bench-$D-qwen0.5b.md 2> $R/bench-$D-qwen0.5b.log
llcinfer bench -m qwen2.5-coder-0.5b --threads 1 -p 0 -n 64 --depth 0,4096 -r 3 --vs llama.cpp --fill synthetic --json $R/bench-$D-t1-qwen0.5b.json > $R/bench-$D-t1-qwen0.5b.md 2> $R/bench-$D-t1-qwen0.5b.log
llcinfer bench -m qwen2.5-coder-0.5b --threads 2 -p 0 -n 128 --depth 16384 -r 3 --vs llama.cpp --alternate block --fill synthetic --json $R/bench-$D-qwen0.5b-d16384.json > $R/bench-$D-qwen0.5b-d16384.md 2> $R/bench-$D-qwen0.5b-d16384.log
llcinfer bench -m qwen2.5-coder-0.5b --threads 1 -p 0 -n 32 --depth 16384 -r 3 --vs llama.cpp --alternate block --fill synthetic --json $R/bench-$D-t1-qwen0.5b-d16384.json > $R/bench-$D-t1-qwen0.5b-d16384.md 2> $R/bench-$D-t1-qwen0.5b-d16384.log
python perf/bench_report.py $R/bench-$D-{smollm2-135m,t1-smollm2-135m,qwen0.5b,t1-qwen0.5b,qwen0.5b-d16384,t1-qwen0.5b-d16384}.json --json $R/bench-$D.json --plot $R/bench-$D.png > $R/bench-$D.md 2>&1
python perf/attention_bench.py --ctx 4096 --threads 1 2 --isa avx2 --reps 5 --json $R/attention-$D-final.json > $R/attention-$D-final.log 2>&1
echo MUSTSHOW_DONE
