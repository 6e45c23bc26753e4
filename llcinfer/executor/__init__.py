"""The dependency-driven decode executor (see decode.py, program.py, step_kernel.py, tiles.py)."""

from .decode import DecodeExecutor, Domains, default_domains, unsupported_reason
from .program import Tiles
from .workers import ExecutorError, WorkerPool

__all__ = ["DecodeExecutor", "Domains", "Tiles", "ExecutorError", "WorkerPool", "default_domains",
           "unsupported_reason"]
