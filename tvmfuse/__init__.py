"""tvmfuse: a model compiler on Apache TVM Relax.

Importing the package is cheap: torch and TVM load only when a function that needs them runs, so
the deployment path (`tvmfuse run`) never imports torch.
"""

from pathlib import Path as _Path

from . import env as _env
from .errors import TvmfuseError

# Before any kernel runs, for the CLI and for scripts alike: TVM's thread pool otherwise takes half
# the cores (measured: every per-kernel profile and tuning measurement made from a script that
# imported tvmfuse.api ran on one of this machine's two cores, at half the speed of the CLI's).
_env.use_all_cores()

# The hand-written schedules live in the repository's top-level schedules/ and install as
# tvmfuse.schedules; a checkout used without installing (PYTHONPATH=the checkout, as on the GPU
# host) finds them there too.
if not (_Path(__file__).parent / "schedules").exists():
    __path__.append(str(_Path(__file__).resolve().parent.parent))  # noqa: F821 - package path

__version__ = "0.1.0"

__all__ = ["TvmfuseError", "__version__"]
