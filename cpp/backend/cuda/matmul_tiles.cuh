// Which rows a prefill matmul block covers (matmul.cu, matmul_q8.cu): either a plain run of BM
// token rows (blockIdx.y), or, for MoE prefill, one tile of the device tile list built by moe.cu
// (Grouped): BM entries of one expert's sorted (token, slot) entries, whose weights start at that
// expert's matrix. Tiles past the list's device length exit.
#pragma once
#include "backend/cuda/common.cuh"

namespace markbase::cuda {

struct TileRows {
  int count = 0, start = 0;
  const mb_u8* w = nullptr;   // the weight matrix of this tile (the expert's, when grouped)
  const int* order = nullptr;
  int a_div = 1;

  // False when this block has no tile (past the grouped list's end).
  __device__ __forceinline__ bool init(const WeightRef& wr, const Grouped& g, int M, int BM) {
    if (g.order) {
      if (static_cast<int>(blockIdx.y) >= *g.n_tiles) return false;
      const int* t = g.tiles + 3 * blockIdx.y;
      w = wr.data + static_cast<size_t>(t[0]) * wr.expert_bytes;
      start = t[1];
      count = t[2];
      order = g.order;
      a_div = g.a_div;
    } else {
      w = wr.data;
      start = blockIdx.y * BM;
      count = min(BM, M - start);
    }
    return true;
  }
  // The activation row and the output row of tile row m; -1 past the tile's rows.
  __device__ __forceinline__ int a_row(int m) const {
    if (m >= count) return -1;
    return order ? order[start + m] / a_div : start + m;
  }
  __device__ __forceinline__ int o_row(int m) const {
    if (m >= count) return -1;
    return order ? order[start + m] : start + m;
  }
};

}  // namespace markbase::cuda
