"""Load and run a built library with the TVM runtime alone: no torch, no compiler passes.

This is the deployment path (`tvmfuse run`); keep its imports to numpy, tvm and our manifest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import TvmfuseError
from .specs import TensorSpec

LIBRARY = "model.so"
MANIFEST = "manifest.json"
#: The model's example inputs and its reference's outputs on them, by name, written at build
#: time: ``tvmfuse run --check`` compares a device's outputs against them, with no torch there.
CHECK = "check.npz"


@dataclass
class Deployed:
    """A loaded build: its manifest and a Relax VM ready to run ``main``."""

    path: Path
    manifest: dict
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    vm: object
    device: object
    #: The RPC address it runs at, or None when it runs in this process.
    rpc: str | None = None

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Run one inference; checks every input against the manifest first."""
        self.check_inputs(arrays)
        args = self._to_device(arrays)
        if self.rpc is None:
            return to_numpy(self.vm["main"](*args))
        # over RPC, main's result would be an opaque remote object: run it statefully instead
        self.vm.set_input("main", *args)
        self.vm.invoke_stateful("main")
        return to_numpy(self.vm.get_outputs("main"))

    def reference(self) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
        """The example inputs and reference outputs saved at build time, or None."""
        path = self.path / CHECK
        if not path.is_file():
            return None
        with np.load(path) as saved:
            return ([saved[f"input:{s.name}"] for s in self.inputs],
                    [saved[f"output:{s.name}"] for s in self.outputs])

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
        if self.rpc is not None:
            raise TvmfuseError("time a remote build with remote_times(), not a local runner")
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


    def remote_times(self, arrays: list[np.ndarray], repeat: int) -> list[float]:
        """Seconds of ``repeat`` runs timed on the remote device itself (RPC builds)."""
        self.vm.set_input("main", *self._to_device(arrays))
        timer = self.vm.time_evaluator("invoke_stateful", self.device, number=1, repeat=repeat)
        return list(timer("main").results)


def load(path: str | Path, rpc: str | None = None) -> Deployed:
    """Load the build in ``path`` here, or on the device an RPC tracker knows as ``rpc``
    (``HOST:PORT:KEY``); a TvmfuseError says why when it cannot run there."""
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
    library = path / manifest["library"]
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    if rpc is None:
        reason = target.why_not_runnable()
        if reason:
            raise TvmfuseError(f"this build cannot run here: {reason}; run it on its device "
                               f"with --rpc HOST:PORT:KEY")
        device = tvm.cuda(0) if target.device == "cuda" else tvm.cpu(0)
        module = tvm.runtime.load_module(str(library))
    else:
        from .remote import Remote  # noqa: PLC0415

        session = Remote.parse(rpc).session()
        session.upload(str(library))
        module = session.load_module(library.name)
        device = session.cuda(0) if target.device == "cuda" else session.cpu(0)
    return Deployed(
        path,
        manifest,
        tuple(TensorSpec.from_json(s) for s in manifest["inputs"]),
        tuple(TensorSpec.from_json(s) for s in manifest["outputs"]),
        relax.VirtualMachine(module, device),
        device,
        rpc,
    )


def to_numpy(result) -> list[np.ndarray]:
    """A VM result (a tensor, or nested tuples of them) as a flat list of numpy arrays."""
    if hasattr(result, "numpy"):
        return [result.numpy()]
    return [leaf for item in result for leaf in to_numpy(item)]
