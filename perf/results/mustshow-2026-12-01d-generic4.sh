#!/bin/bash
# Check of 84c0dca (the 4-row loops no longer compiled per weight type, to cut the cold
# compile; reverted after this run): pp512 and tg at d0 side by side with llama.cpp, 2 threads, and the
# start-up times (cold and warm) with the final kernels.
cd /work/main
D=2026-12-01d-generic4
R=perf/results
set -x
for m in smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b; do
  llcinfer bench -m $m --threads 2 -p 512 -n 128 --depth 0 -r 4 --vs llama.cpp --json $R/bench-$D-$m.json > $R/bench-$D-$m.md 2> $R/bench-$D-$m.log
done
python perf/bench_report.py $R/bench-$D-{smollm2-135m,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b}.json --json $R/bench-$D.json > $R/bench-$D.md 2>&1
python perf/startup.py --warm-runs 3 --threads 2 --no-baseline --json $R/startup-$D.json > $R/startup-$D.log 2>&1
echo RECHECK_DONE
