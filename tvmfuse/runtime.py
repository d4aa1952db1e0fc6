"""Load and run a built library with the TVM runtime alone: no torch, no compiler passes.

This is the deployment path (`tvmfuse run`); keep its imports to numpy, tvm and our manifest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import env
from .errors import TvmfuseError
from .specs import TensorSpec

LIBRARY = "model.so"
MANIFEST = "manifest.json"


@dataclass
class Deployed:
    """A loaded build: its manifest and a Relax VM ready to run ``main``."""

    path: Path
    manifest: dict
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    vm: object
    device: object

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Run one inference; checks every input against the manifest first."""
        self.check_inputs(arrays)
        return to_numpy(self.vm["main"](*self._to_device(arrays)))

    def check_inputs(self, arrays: list[np.ndarray]) -> None:
        if len(arrays) != len(self.inputs):
            raise TvmfuseError(
                f"the model takes {len(self.inputs)} input(s) "
                f"({', '.join(s.name for s in self.inputs)}), {len(arrays)} given"
            )
        for spec, array in zip(self.inputs, arrays):
            spec.check(array)

    def runner(self, arrays: list[np.ndarray]):
        """A zero-argument callable running one blocking inference on ``arrays`` (for timing):
        inputs are checked and copied to the device once, up front."""
        self.check_inputs(arrays)
        args = self._to_device(arrays)
        main = self.vm["main"]

        def run_once():
            main(*args)
            self.device.sync()

        return run_once

    def _to_device(self, arrays):
        import tvm  # noqa: PLC0415

        return [tvm.runtime.tensor(np.ascontiguousarray(a), self.device) for a in arrays]


def load(path: str | Path) -> Deployed:
    """Load the build in ``path``; a TvmfuseError says why when it cannot run here."""
    env.use_all_cores()
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise TvmfuseError(f"{path} is not a tvmfuse build: it has no {MANIFEST}")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as err:
        raise TvmfuseError(f"{manifest_path} is not valid JSON ({err}); rebuild the model") from None
    from .targets import get_target  # noqa: PLC0415

    target = get_target(manifest["target"]["name"])
    reason = target.why_not_runnable()
    if reason:
        raise TvmfuseError(f"this build cannot run here: {reason}")
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    device = tvm.cuda(0) if target.device == "cuda" else tvm.cpu(0)
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(path / manifest["library"])), device)
    return Deployed(
        path,
        manifest,
        tuple(TensorSpec.from_json(s) for s in manifest["inputs"]),
        tuple(TensorSpec.from_json(s) for s in manifest["outputs"]),
        vm,
        device,
    )


def to_numpy(result) -> list[np.ndarray]:
    """A VM result (a tensor, or nested tuples of them) as a flat list of numpy arrays."""
    if hasattr(result, "numpy"):
        return [result.numpy()]
    return [leaf for item in result for leaf in to_numpy(item)]
