// Host check of the CUDA decode units' Q4_K / Q5_K scale unpacking (cpp/backend/cuda/q8.cuh):
// reads 12-byte scale headers from stdin and prints, for each header and each of its 8
// sub-blocks, the 6-bit scale and minimum from k4_scale_min (one sub-block, with a branch) and
// from k4_scale_min_pair (both sub-blocks of a pair at once, without one). tests/test_cuda_backend.py
// compares both with the gguf package's Q4_K unpacking. Host code only: runs without a GPU.
#include <cstdio>
#include <cstring>

#include "backend/cuda/q8.cuh"

int main() {
  unsigned char h[12];
  while (std::fread(h, 1, 12, stdin) == 12) {
    unsigned sc[3];
    std::memcpy(sc, h, 12);  // little-endian words, as the kernels load them
    for (int s = 0; s < 8; ++s) {
      int scale, min;
      markbase::cuda::k4_scale_min(sc, s, scale, min);
      unsigned scales, mins;
      markbase::cuda::k4_scale_min_pair(sc, s / 2, scales, mins);
      const int sh = 8 * (s & 1);
      std::printf("%d %d %u %u%c", scale, min, (scales >> sh) & 0xFF, (mins >> sh) & 0xFF, s == 7 ? '\n' : ' ');
    }
  }
  return 0;
}
