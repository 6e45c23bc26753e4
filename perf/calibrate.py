"""The first-use calibration (engine/calibrate.py) run by hand: measure this machine's kernel
rates for some catalog models and report what each item cost.

    python perf/calibrate.py [--threads 2] [--models smollm2-135m,...] [--fresh]

``--fresh`` removes the cached calibration (and bandwidth curve) of this machine and kernel
version first, so everything is measured again: the cost of a first use.  Writes
$LLCINFER_HOME/machine/calibration-<machine key>-k<kernel version>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llcinfer.engine.calibrate import ensure_calibration  # noqa: E402
from llcinfer.engine.transformer import Transformer  # noqa: E402
from llcinfer.hw.bandwidth import curve_path  # noqa: E402
from llcinfer.jit import set_threads  # noqa: E402
from llcinfer.model import catalog  # noqa: E402
from llcinfer.model.gguf_file import GGUFFile  # noqa: E402
from llcinfer.planner import Calibration, cache_key, detect_machine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b")
    ap.add_argument("--fresh", action="store_true", help="forget the cached calibration and curve first")
    a = ap.parse_args()
    threads = set_threads(a.threads)
    machine = detect_machine(probe=False)
    if a.fresh:
        for p in (Calibration.path(cache_key(machine)), curve_path(machine)):
            if os.path.exists(p):
                os.remove(p)
        machine = detect_machine(probe=False)
    for name in a.models.split(","):
        model = Transformer(GGUFFile(catalog.resolve_model(name, progress=False)))
        t0 = time.perf_counter()
        cal = ensure_calibration(model, machine, threads)
        print(f"{name}: {time.perf_counter() - t0:.1f} s", flush=True)
    print(json.dumps({k: getattr(cal, k) for k in ("matmul_stream_gbs", "matmul_compute", "attention_stream_gbs",
                                                    "attention_flops_per_core", "step_overhead_ns",
                                                    "step_overhead_seq_ns", "measured")}, indent=1))


if __name__ == "__main__":
    main()
