"""The warp shuffles of a CUDA source (TVM's codegen) that stand inside a condition (``?:``,
``||``, ``&&``) on their line: C evaluates those lazily, so such a shuffle is made by the lanes
whose condition went its way only, and a shuffle of the whole warp's mask that some lanes never
reach hangs the GPU. Found without a GPU."""
import re

_SHUFFLE = re.compile(r"__shfl\w*_sync")
_CONDITION = re.compile(r"\?|\|\||&&")


def conditional_shuffles(source: str) -> list[str]:
    """Each line of ``source`` that shuffles under a condition (stripped)."""
    return [line.strip() for line in source.splitlines()
            if _SHUFFLE.search(line) and _CONDITION.search(line)]
