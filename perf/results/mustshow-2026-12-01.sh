#!/bin/bash
# Must-show runs for issue 3, eighth session: the same engine as mustshow-2026-11-30-xahead.sh
# (no kernel or executor change since), run again to see how far the table moves with the
# shared host's state (bandwidth between about 28 and 55 GB/s at 2 threads); same commands
# as mustshow-2026-11-30-kt.sh, results named 2026-12-01.
exec bash "$(dirname "$0")/mustshow-2026-11-30-kt.sh" 2026-12-01
