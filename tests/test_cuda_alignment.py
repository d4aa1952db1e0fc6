"""The alignment check of CUDA sources (tests/cuda_alignment.py) on accesses of known
alignment."""

from cuda_alignment import misaligned

SOURCE = """
extern "C" __global__ void __launch_bounds__(128) rows(half* __restrict__ A, half* __restrict__ B) {
  int cse_var_1 = (((int)threadIdx.x) * 8);
  *(uint4*)(B + (cse_var_1 + (((int)blockIdx.x) * 1024))) =
    *(uint4*)(A + ((((int)blockIdx.x) * 160) + cse_var_1));
  *(uint4*)(B + ((((int)threadIdx.x) * 20) + 4)) = *(uint4*)(A + ((((int)threadIdx.x) >> 2) * 8));
  ((half2*)(B + ((((int)threadIdx.x) * 3))))[0] =
    ((half2*)(((half*)buf_dyn_shmem) + ((((int)threadIdx.x) & 3) * 3)))[0];
}
"""


def test_unaligned_vector_indices_are_found_and_aligned_ones_pass():
    found = {(vec, ptr, step) for _, vec, ptr, _, _, step, _ in misaligned(SOURCE)}
    # rows of 160 halves keep 16-byte vectors aligned; 20 halves a thread plus 4 do not, nor
    # half2 pairs 3 halves apart
    # nor a dynamic shared buffer's pairs 3 halves apart
    assert found == {("uint4", "B", (20, 4)), ("half2", "B", (3, 0)),
                     ("half2", "buf_dyn_shmem", (3, 0))}
