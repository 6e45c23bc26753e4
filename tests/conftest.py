import os
import sys

# tests import helper modules (real_models, tiny_models) from this folder
sys.path.insert(0, os.path.dirname(__file__))

# tests never time anything: no first-use kernel calibration, no start-up plan check
# (test_planner injects its own timings)
os.environ.setdefault("LLCINFER_CALIBRATE", "0")
