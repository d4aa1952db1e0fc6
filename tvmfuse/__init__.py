"""tvmfuse: a model compiler on Apache TVM Relax.

Importing the package is cheap: torch and TVM load only when a function that needs them runs, so
the deployment path (`tvmfuse run`) never imports torch.
"""

from . import env as _env
from .errors import TvmfuseError
from .inspect_cache import cache_frozen_module_files as _cache_frozen_module_files

# Before any kernel runs, for the CLI and for scripts alike: TVM's thread pool otherwise takes half
# the cores (measured: every per-kernel profile and tuning measurement made from a script that
# imported tvmfuse.api ran on one of this machine's two cores, at half the speed of the CLI's).
_env.use_all_cores()
# Before TVMScript parses anything: each of its decorators inspects the stack (see the module).
_cache_frozen_module_files()

__version__ = "0.1.0"

__all__ = ["TvmfuseError", "__version__"]
