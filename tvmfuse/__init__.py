"""tvmfuse: a model compiler on Apache TVM Relax.

Importing the package is cheap: torch and TVM load only when a function that needs them runs, so
the deployment path (`tvmfuse run`) never imports torch.
"""

from .errors import TvmfuseError

__version__ = "0.1.0"

__all__ = ["TvmfuseError", "__version__"]
