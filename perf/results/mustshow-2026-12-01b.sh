#!/bin/bash
# Must-show runs for issue 3, ninth session: the engine of 2026-12-01 after the file splits
# (simd / simd_math, vnni_matmul / vnni_blocks, repack_cache / repack_file / page_cache;
# no change to the emitted kernels), run again; then the start-up times and the assembly
# evidence, which the previous two runs did not repeat.
cd /work/main
D=2026-12-01b
R=perf/results
bash "$(dirname "$0")/mustshow-2026-11-30-kt.sh" $D
set -x
python perf/startup.py --warm-runs 3 --threads 2 --json $R/startup-$D.json > $R/startup-$D.log 2>&1  # rerun by hand: --markdown, in the first version of this line, does not exist
python perf/kernel_asm.py > $R/asm-$D-matmul.json 2> $R/asm-$D-matmul.log
python perf/attention_bench.py --models qwen smollm2 --ctx 4096 --threads 1 2 --reps 5 --json $R/attention-$D.json > $R/attention-$D.md 2>&1
echo MUSTSHOW_DONE
