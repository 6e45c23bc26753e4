#!/bin/bash
# Recheck of the final engine (692a3bd: the table's kernels plus Q8_0's k-group-by-k-group
# i16 sums): pp512 and tg at d0 of the two models with Q8_0 matrices, 2 threads,
# alternating with llama.cpp, then start-up (cold and warm) with these kernels.
cd /work/main
D=2026-12-01d-final
R=perf/results
set -x
for m in smollm2-135m qwen2.5-coder-0.5b; do
  llcinfer bench -m $m --threads 2 -p 512 -n 128 --depth 0 -r 4 --vs llama.cpp --json $R/bench-$D-$m.json > $R/bench-$D-$m.md 2> $R/bench-$D-$m.log
done
python perf/bench_report.py $R/bench-$D-{smollm2-135m,qwen2.5-coder-0.5b}.json --json $R/bench-$D.json > $R/bench-$D.md 2>&1
python perf/startup.py --warm-runs 3 --threads 2 --no-baseline --json $R/startup-$D.json > $R/startup-$D.log 2>&1
echo FINAL_DONE
