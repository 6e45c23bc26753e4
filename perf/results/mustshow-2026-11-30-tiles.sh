#!/bin/bash
# Must-show runs for issue 3 after per-worker tile regions, reference-count-free tile calls
# and the shorter Python around a decode step (on top of the serve loop and the head-major
# KV pool): the same commands as mustshow-2026-11-30-kt.sh, results named 2026-11-30-tiles;
# one after the other on an otherwise idle 2-vCPU host (shared with other tenants).
exec bash "$(dirname "$0")/mustshow-2026-11-30-kt.sh" 2026-11-30-tiles
