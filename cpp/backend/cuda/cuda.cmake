# The CUDA backend (CMAKE_ARGS="-DMARKBASE_CUDA=ON"), included by the top-level CMakeLists.txt
# after markbase_core is defined. Needs nvcc; links only the CUDA runtime (statically), no cuBLAS.
# Targets: sm_90a machine code for Hopper (H100/H200) plus compute_80 PTX, which the driver
# compiles at load time on any other GPU of compute capability 8.0 or newer.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90a-real 80-virtual)
endif()
if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/bin/nvcc)
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)

target_sources(markbase_core PRIVATE
  cpp/backend/cuda/cuda_backend.cpp
  cpp/backend/cuda/matvec.cu
  cpp/backend/cuda/matvec_q8.cu
  cpp/backend/cuda/matmul.cu
  cpp/backend/cuda/matmul_q8.cu
  cpp/backend/cuda/norm_rope.cu
  cpp/backend/cuda/attention.cu
  cpp/backend/cuda/attention_tc.cu
  cpp/backend/cuda/moe.cu
  cpp/backend/cuda/sample.cu
)
target_compile_definitions(markbase_core PRIVATE MARKBASE_HAVE_CUDA)
# Experimental, off until measured (common.cuh): decode reads its weights as L2 evict_first.
option(MARKBASE_CUDA_WEIGHTS_EVICT_FIRST "CUDA: weights read with the L2 evict_first policy" OFF)
if(MARKBASE_CUDA_WEIGHTS_EVICT_FIRST)
  target_compile_definitions(markbase_core PRIVATE MARKBASE_CUDA_WEIGHTS_EVICT_FIRST=1)
endif()
target_link_libraries(markbase_core PUBLIC CUDA::cudart_static)
# The kernels include metal/dequant.h (shared with the Metal backend) by relative path; the
# library is linked into a Python extension, so position-independent device code too.
# markbase_core exists before CUDA is enabled, so its architectures are set here, not inherited.
set_target_properties(markbase_core PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}"
  CUDA_SEPARABLE_COMPILATION OFF POSITION_INDEPENDENT_CODE ON)
# The host compiler's warning flags set on markbase_core are not nvcc options: keep them C++-only.
get_target_property(_mb_opts markbase_core COMPILE_OPTIONS)
if(_mb_opts)
  set_property(TARGET markbase_core PROPERTY COMPILE_OPTIONS "$<$<COMPILE_LANGUAGE:CXX>:${_mb_opts}>")
endif()
target_compile_options(markbase_core PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo>)
