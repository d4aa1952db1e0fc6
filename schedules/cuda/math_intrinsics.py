"""CUDA lowerings of the math intrinsics TVM's CUDA codegen has no rule for.

TVM 0.27 lowers ``exp``, ``tanh``, ``atan`` and the like to CUDA's math library, but not the
inverse trigonometric and hyperbolic functions, ``log1p``, ``atan2``, ``hypot``, ``copysign`` or
``nextafter``: a kernel that calls one fails to build ("Unresolved call tirx.acos": YOSO's
hashing attention, ``benchmarks/coverage.py --target cuda-sm90 --dtype fp16``). CUDA has each
for float (``acosf``) and double (``acos``); half and bfloat16 compute in float, as TVM's own
rules do where CUDA has no ``h`` function. Registered when ``tvmfuse.schedules.cuda`` is
imported, at a level under TVM's, so a rule TVM adds later takes precedence.
"""

from __future__ import annotations

from tvm import tirx

#: The functions, by the number of operands they take.
UNARY = ("acos", "asin", "acosh", "asinh", "atanh", "log1p")
BINARY = ("atan2", "hypot", "copysign", "nextafter")
#: TVM's own CUDA rules register at level 10; ours yield to any it adds.
LEVEL = 5


def _rule(name: str):
    def lower(call):
        dtype = str(call.ty)
        if dtype == "float64":
            return tirx.call_pure_extern(dtype, name, *call.args)
        if dtype == "float32":
            return tirx.call_pure_extern(dtype, f"{name}f", *call.args)
        if dtype in ("float16", "bfloat16"):
            wide = [arg.astype("float32") for arg in call.args]
            return tirx.call_pure_extern("float32", f"{name}f", *wide).astype(dtype)
        return call  # vectors and integers: left for TVM to report

    return lower


for _name in (*UNARY, *BINARY):
    tirx.register_intrin_lowering(f"tirx.{_name}", target="cuda", f=_rule(_name), level=LEVEL)
