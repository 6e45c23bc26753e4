"""Running the command line, in a child process or in this one, for the error tests.

Not a test module: the command-line error tests import it.
"""

import os
import subprocess
import sys

import pytest


# a child whose LLCINFER_HOME is a test's fresh one compiles the decode kernels and runs the
# first-use calibration before it runs: over 300 s on a 2-core AVX2 host (Zen 3, 2026-12-07)
CHILD_SECONDS = 900


def run_cli(*args, stdin=None):
    """``llcinfer ARGS`` as a new process; asserts that nothing printed a traceback."""
    proc = subprocess.run(
        [sys.executable, "-c", "from llcinfer.cli import main; main()", *map(str, args)],
        capture_output=True, text=True, timeout=CHILD_SECONDS, input=stdin,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    return proc


def run_main(capsys, *args) -> tuple[int, str, str]:
    """``llcinfer ARGS`` in this process (its kernels are compiled already): (rc, out, err)."""
    from llcinfer.cli import main

    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return exc.value.code, out.out, out.err


def assert_one_error_line(proc, rc, *fragments):
    """Exit code ``rc`` and exactly one ``error:`` line on stderr, holding every fragment."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == rc, (proc.returncode, proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    for frag in fragments:
        assert frag in lines[0], f"{frag!r} not in {lines[0]!r}"
