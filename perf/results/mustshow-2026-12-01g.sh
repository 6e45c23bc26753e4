#!/bin/bash
# Must-show rows for issue 3, fourteenth session (same Zen 3 host kind, 2 vCPUs, AVX2):
# the engine with the weight stream prefetched in the one-row matvec loops (a8d1abc) and
# the KV prefetch spread over the work on a block (25f6787).  Time allowed only the
# Qwen2.5-0.5B rows (the target still missed last session) and SmolLM2 at 1 thread; the
# other rows are in mustshow-2026-12-01f.sh's results, from before both changes.
cd /work/main
. .venv/bin/activate
D=2026-12-01g
R=perf/results
set -x
llcinfer generate -m qwen2.5-coder-0.5b --temp 0 -n 4 "warm the caches" > $R/warmup-$D.log 2>&1
llcinfer bench -m qwen2.5-coder-0.5b --threads 2 -p 512 -n 128 --depth 0,4096 -r 4 --vs llama.cpp --fill-limit 600 --json $R/bench-$D-qwen0.5b.json > $R/bench-$D-qwen0.5b.md 2> $R/bench-$D-qwen0.5b.log
llcinfer bench -m qwen2.5-coder-0.5b --threads 1 -p 0 -n 64 --depth 0,4096 -r 3 --vs llama.cpp --fill synthetic --json $R/bench-$D-t1-qwen0.5b.json > $R/bench-$D-t1-qwen0.5b.md 2> $R/bench-$D-t1-qwen0.5b.log
llcinfer bench -m smollm2-135m --threads 1 -p 0 -n 64 --depth 0,4096 -r 3 --vs llama.cpp --fill synthetic --json $R/bench-$D-t1-smollm2-135m.json > $R/bench-$D-t1-smollm2-135m.md 2> $R/bench-$D-t1-smollm2-135m.log
python perf/bench_report.py $R/bench-$D-{qwen0.5b,t1-qwen0.5b,t1-smollm2-135m}.json --json $R/bench-$D.json > $R/bench-$D.md 2>&1
echo MUSTSHOW_DONE
