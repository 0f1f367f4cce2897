"""dflash-serve operations: the CLI, planner, chart rendering, benchmark and local stack."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dflash-serve")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
