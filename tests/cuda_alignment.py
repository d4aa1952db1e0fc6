"""The vector accesses of a CUDA source (TVM's codegen) whose index is not provably a multiple
of the vector's elements (``*(uint4*)(p + (idx))``, ``((half2*)(p + (idx)))[0]``): the
accesses that fault with cudaErrorMisalignedAddress for some shapes, found without a GPU.

Index terms are tracked as modular sets (coefficient, base: the values ``coefficient * n +
base``): thread, block and loop variables are any integer (1, 0), constants exact, and the
kernel's ``int v = expr;`` definitions are followed, a min or max takes the values of either
side. An index the tracking cannot read (a select) counts as not provable. Buffers are taken
as 16-byte aligned (TVM allocates them so), so an index that is a multiple of the vector's
elements is an aligned access."""
import math
import re
import sys

VEC_BYTES = {"uint4": 16, "int4": 16, "float4": 16, "longlong2": 16, "ulonglong2": 16,
             "uint2": 8, "int2": 8, "float2": 8, "half4": 8, "longlong1": 8,
             "half2": 4, "nv_bfloat162": 4, "__nv_bfloat162": 4, "uint1": 4, "float1": 4}
ELEM_BYTES = {"half": 2, "nv_bfloat16": 2, "__nv_bfloat16": 2, "float": 4, "int": 4,
              "signed char": 1, "char": 1, "uchar": 1, "unsigned char": 1}


class M:
    """A modular set: the integers ``c * n + b``."""

    def __init__(self, c, b):
        self.c, self.b = c, (b % c if c else b)

    @staticmethod
    def of(x):
        return x if isinstance(x, M) else M(0, int(x))

    def __add__(s, o):
        o = M.of(o)
        return M(math.gcd(s.c, o.c), s.b + o.b)
    __radd__ = __add__

    def __sub__(s, o):
        o = M.of(o)
        return M(math.gcd(s.c, o.c), s.b - o.b)

    def __rsub__(s, o):
        return M.of(o) - s

    def __neg__(s):
        return M(s.c, -s.b)

    def __mul__(s, o):
        o = M.of(o)
        if s.c == 0 and o.c == 0:
            return M(0, s.b * o.b)
        return M(math.gcd(math.gcd(s.c * o.c, s.c * o.b), o.c * s.b), s.b * o.b)
    __rmul__ = __mul__

    def __floordiv__(s, o):
        o = M.of(o)
        if o.c == 0 and s.c == 0:
            return M(0, int(s.b / o.b))
        if o.c == 0 and o.b and s.c % o.b == 0 and s.b % o.b == 0:
            return M(s.c // o.b, s.b // o.b)
        return M(1, 0)
    __truediv__ = __floordiv__

    def __mod__(s, o):
        o = M.of(o)
        if o.c == 0 and o.b:
            if s.c == 0:
                return M(0, s.b % o.b)
            g = math.gcd(s.c, o.b)
            return M(g, s.b % g)
        return M(1, 0)

    def __and__(s, o):
        o = M.of(o)
        if o.c == 0 and (o.b + 1) & o.b == 0:  # x & (2^k - 1) == x % 2^k
            return s % (o.b + 1)
        return M(1, 0)
    __rand__ = __and__

    def __or__(s, o):
        return M(1, 0)
    __ror__ = __or__

    def __lshift__(s, o):
        return s * (1 << M.of(o).b)

    def __rshift__(s, o):
        return s // (1 << M.of(o).b)

    def __lt__(s, o):
        return M(1, 0)
    __gt__ = __le__ = __ge__ = __lt__


ANY = M(1, 0)


def _either(a, b) -> M:
    """The values of ``min(a, b)`` or ``max(a, b)``: those of either."""
    a, b = M.of(a), M.of(b)
    step = math.gcd(math.gcd(a.c, b.c), abs(a.b - b.b))
    return M(step, a.b)


def _balanced(text, start):
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return -1


def evaluate(expr, env):
    e = re.sub(r"\((?:int|long|int64_t|long long|unsigned int|uint)\)", "", expr)
    e = re.sub(r"(\d+)LL|(\d+)U", lambda m: m.group(1) or m.group(2), e)
    e = e.replace("threadIdx.x", "ANY").replace("threadIdx.y", "ANY").replace(
        "threadIdx.z", "ANY").replace("blockIdx.x", "ANY").replace("blockIdx.y", "ANY").replace(
        "blockIdx.z", "ANY")
    if "?" in expr:  # a select: not tracked
        return None

    helpers = {"ANY": ANY, "min": _either, "max": _either}

    class Env(dict):  # a name the kernel defined, else any integer (a loop variable)
        def __missing__(self, key):
            if key in helpers:
                raise KeyError(key)
            return env.get(key, ANY)
    e = e.replace("/", "//").replace("////", "//")
    try:
        return M.of(eval(e, helpers, Env()))
    except Exception:
        return None


def misaligned(source: str) -> list[tuple]:
    """``(kernel, vector type, pointer, element type, elements, (coefficient, base) or None,
    index)`` of each vector access not provably aligned."""
    bad = []
    for kernel in re.split(r'(?=extern "C" __global__)', source):
        name = re.search(r"void (?:__launch_bounds__\([^)]*\) )?(\w+)\(", kernel)
        if not name:
            continue
        name = name.group(1)
        types = {}
        for t, p in re.findall(r"(half|float|nv_bfloat16|__nv_bfloat16|int|signed char)\* "
                               r"(?:__restrict__ )?(\w+)", kernel):
            types[p] = t
        env = {}
        for var, rhs in re.findall(r"\bint (\w+) = ([^;]+);", kernel):
            v = evaluate(rhs, env)
            env[var] = v if v is not None else ANY
        for m in re.finditer(r"\((\w+)\*\)\((?:\(\((\w+)\*\)(\w+)\)|(\w+)) \+ ", kernel):
            vec, cast, ptr = m.group(1), m.group(2), m.group(3) or m.group(4)
            if vec not in VEC_BYTES:
                continue
            elem = cast or types.get(ptr)
            if elem not in ELEM_BYTES:
                continue
            start = m.end()
            # the index: the balanced parenthesised expression after "+ "
            if kernel[start] != "(":
                idx_end = re.match(r"[\w.]+", kernel[start:]).end() + start
                idx = kernel[start:idx_end]
            else:
                idx_end = _balanced(kernel, start)
                idx = kernel[start:idx_end + 1]
            need = VEC_BYTES[vec] // ELEM_BYTES[elem]
            if need <= 1:
                continue
            val = evaluate(idx, env)
            if val is None or val.c % need or val.b % need:
                bad.append((name, vec, ptr, elem, need, None if val is None else (val.c, val.b),
                            idx[:200]))
        # cp.async through tvmfuse's helper (schedules/cuda/cp_async.py): its name holds the
        # copy's bytes and the source's element bytes, its fourth argument the source offset
        for m in re.finditer(r"\btvmfuse_cp_async(?:_pred)?_\w+?_(\d+)_\d+_(\d+)\(", kernel):
            end = _balanced(kernel, m.end() - 1)
            args = _split_arguments(kernel[m.end():end])
            size, element = int(m.group(1)), int(m.group(2))
            if len(args) < 4 or args[0].startswith("void") or size // element <= 1:
                continue
            need = size // element
            val = evaluate(args[3], env)
            if val is None or val.c % need or val.b % need:
                bad.append((name, f"cp.async {size}", args[2], element, need,
                            None if val is None else (val.c, val.b), args[3][:200]))
    return bad


def _split_arguments(text: str) -> list[str]:
    """The top-level comma-separated arguments of a call's text."""
    args, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            args.append(text[start:i].strip())
            start = i + 1
    return [*args, text[start:].strip()]


if __name__ == "__main__":  # python tests/cuda_alignment.py kernels.cu
    for row in misaligned(open(sys.argv[1]).read()):
        print(*row, sep=" | ")
