#!/bin/bash
# Must-show rows for issue 3, fifteenth session (same Zen 3 host kind, 2 vCPUs, AVX2), after
# 42cffcd (P V passes of 3 V vectors for groups of at most 3 heads): the SmolLM2 rows, the
# only model whose attention the change touches much (3 heads per KV head; Qwen's 4 + 3
# groups measured 1.00x), at 2 and 1 thread; then the attention and matvec ceilings.  The
# other rows are in mustshow-2026-12-01g*.sh's results (bench-2026-12-01g), same kernels.
cd /work/main
. .venv/bin/activate
D=2026-12-01h
R=perf/results
set -x
llcinfer generate -m smollm2-135m --temp 0 -n 4 "warm the caches" > $R/warmup-$D.log 2>&1
llcinfer bench -m smollm2-135m --threads 2 -p 0 -n 128 --depth 0,4096,8000 -r 4 --vs llama.cpp --fill synthetic --json $R/bench-$D-smollm2-135m.json > $R/bench-$D-smollm2-135m.md 2> $R/bench-$D-smollm2-135m.log
llcinfer bench -m smollm2-135m --threads 1 -p 0 -n 64 --depth 0,4096,8000 -r 3 --vs llama.cpp --fill synthetic --json $R/bench-$D-t1-smollm2-135m.json > $R/bench-$D-t1-smollm2-135m.md 2> $R/bench-$D-t1-smollm2-135m.log
python perf/bench_report.py $R/bench-$D-{smollm2-135m,t1-smollm2-135m}.json --json $R/bench-$D.json > $R/bench-$D.md 2>&1
python perf/attention_bench.py --ctx 4096 --threads 1 2 --isa avx2 --reps 5 --json $R/attention-$D.json > $R/attention-$D.log 2>&1
python perf/matvec_ceiling.py --json $R/matvec-ceiling-$D.json > $R/matvec-ceiling-$D.log 2>&1
echo MUSTSHOW_DONE
