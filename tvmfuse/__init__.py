"""tvmfuse: a model compiler on Apache TVM Relax.

Importing the package is cheap: torch and TVM load only when a function that needs them runs, so
the deployment path (`tvmfuse run`) never imports torch.
"""

from pathlib import Path as _Path

from .errors import TvmfuseError

# The hand-written schedules live in the repository's top-level schedules/ and install as
# tvmfuse.schedules; a checkout used without installing (PYTHONPATH=the checkout, as on the GPU
# host) finds them there too.
if not (_Path(__file__).parent / "schedules").exists():
    __path__.append(str(_Path(__file__).resolve().parent.parent))  # noqa: F821 - package path

__version__ = "0.1.0"

__all__ = ["TvmfuseError", "__version__"]
