#!/bin/bash
# Must-show runs for issue 3, tenth session: the repack cache starts on the file's mapping
# and moves onto 2 MiB pages after the first token (file_pages.py); the decode kernels are
# those of the ninth session.  Start-up first (what changed), then the TPOT table on this
# session's machine (a fresh checkout: models fetched and llama.cpp built again), then the
# assembly evidence.
cd /work/main
D=2026-12-01c
R=perf/results
set -x
python perf/startup.py --warm-runs 3 --threads 2 --json $R/startup-$D.json > $R/startup-$D.log 2>&1
bash "$(dirname "$0")/mustshow-2026-11-30-kt.sh" $D
python perf/kernel_asm.py > $R/asm-$D-matmul.json 2> $R/asm-$D-matmul.log
echo MUSTSHOW_DONE
