# metal_emu.cmake -- the emulated Metal runtime for Linux builds (MARKBASE_METAL_EMU=ON).
#
# Included by the top-level CMakeLists.txt after project(), with clang++-16 as the C++
# compiler. Provides:
#
#   target msl_emu                        static library: the msl_emu kernel runtime, the fake
#                                         Objective-C runtime + Metal classes, and metal-cpp's
#                                         implementation unit. PUBLIC: include dirs (metal-cpp,
#                                         SDK stubs, msl_emu/runtime.h, msl_emu/counters.h),
#                                         -fblocks, BlocksRuntime, Threads, dl. PIC.
#   msl_emu_add_kernels(<target> <file.metal>...)
#                                         runs gen.py on each .metal at build time and compiles
#                                         the output into <target> (directly, so that the
#                                         kernels' self-registration survives static linking)
#   METAL_CPP_DIR (cache)                 a metal-cpp copy to use instead of downloading one
#   MSL_EMU_METAL_CPP_DIR                 the metal-cpp directory in use
#   MSL_EMU_INCLUDE_DIR                   tests/metal_emu/include (the MSL shim and msl_emu API)
#   MSL_EMU_GEN                           tests/metal_emu/gen.py
include_guard(GLOBAL)

set(MSL_EMU_DIR "${CMAKE_CURRENT_LIST_DIR}")
set(MSL_EMU_INCLUDE_DIR "${MSL_EMU_DIR}/include")
set(MSL_EMU_GEN "${MSL_EMU_DIR}/gen.py")

if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "msl_emu needs clang (ext_vector_type, blocks); configure with "
                      "-DCMAKE_CXX_COMPILER=clang++-16 (Debian package clang-16)")
endif()
if(NOT CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64")
  message(FATAL_ERROR "msl_emu's fake Objective-C runtime has x86-64 objc_msgSend trampolines only "
                      "(this is ${CMAKE_SYSTEM_PROCESSOR})")
endif()

find_package(Python3 COMPONENTS Interpreter REQUIRED)
find_package(Threads REQUIRED)

# ---------------------------------------------------------------- metal-cpp
set(METAL_CPP_DIR "" CACHE PATH "metal-cpp directory (with Foundation/ and Metal/); empty: download pymetal-cpp 0.1.5's copy")
if(METAL_CPP_DIR)
  set(MSL_EMU_METAL_CPP_DIR "${METAL_CPP_DIR}")
else()
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" "${MSL_EMU_DIR}/../../cpp/backend/metal/fetch_metal_cpp.py" "${CMAKE_BINARY_DIR}/_deps/metal_cpp"
    RESULT_VARIABLE _msl_emu_rc
    OUTPUT_VARIABLE _msl_emu_out
    ERROR_VARIABLE _msl_emu_err
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _msl_emu_rc EQUAL 0)
    message(FATAL_ERROR "msl_emu: could not obtain metal-cpp:\n${_msl_emu_err}")
  endif()
  set(MSL_EMU_METAL_CPP_DIR "${_msl_emu_out}")
endif()
if(NOT EXISTS "${MSL_EMU_METAL_CPP_DIR}/Metal/Metal.hpp" OR NOT EXISTS "${MSL_EMU_METAL_CPP_DIR}/Foundation/Foundation.hpp")
  message(FATAL_ERROR "msl_emu: '${MSL_EMU_METAL_CPP_DIR}' is not a metal-cpp directory (no Metal/Metal.hpp)")
endif()
message(STATUS "msl_emu: metal-cpp from ${MSL_EMU_METAL_CPP_DIR}")

# ---------------------------------------------------------------- BlocksRuntime
find_library(MSL_EMU_BLOCKS_RUNTIME BlocksRuntime)
find_path(MSL_EMU_BLOCK_H Block.h)
if(NOT MSL_EMU_BLOCKS_RUNTIME OR NOT MSL_EMU_BLOCK_H)
  message(FATAL_ERROR "msl_emu: libBlocksRuntime not found (Debian package libblocksruntime-dev)")
endif()

# ---------------------------------------------------------------- the library
add_library(msl_emu STATIC
  "${MSL_EMU_DIR}/runtime/bindings.cpp"
  "${MSL_EMU_DIR}/runtime/dispatch.cpp"
  "${MSL_EMU_DIR}/runtime/errors.cpp"
  "${MSL_EMU_DIR}/runtime/fiber.cpp"
  "${MSL_EMU_DIR}/runtime/options.cpp"
  "${MSL_EMU_DIR}/runtime/registry.cpp"
  "${MSL_EMU_DIR}/runtime/threadgroup.cpp"
  "${MSL_EMU_DIR}/fake_metal/buffer.cpp"
  "${MSL_EMU_DIR}/fake_metal/commands.cpp"
  "${MSL_EMU_DIR}/fake_metal/counters.cpp"
  "${MSL_EMU_DIR}/fake_metal/device.cpp"
  "${MSL_EMU_DIR}/fake_metal/foundation.cpp"
  "${MSL_EMU_DIR}/fake_metal/library.cpp"
  "${MSL_EMU_DIR}/fake_metal/metal_cpp_impl.cpp"
  "${MSL_EMU_DIR}/fake_metal/objc_runtime.cpp"
)
target_include_directories(msl_emu PUBLIC
  "${MSL_EMU_METAL_CPP_DIR}"
  "${MSL_EMU_DIR}/fake_metal/sdk"
  "${MSL_EMU_INCLUDE_DIR}")
target_compile_features(msl_emu PUBLIC cxx_std_17)
target_compile_options(msl_emu PUBLIC -fblocks)
target_link_libraries(msl_emu PUBLIC "${MSL_EMU_BLOCKS_RUNTIME}" Threads::Threads ${CMAKE_DL_LIBS})
set_target_properties(msl_emu PROPERTIES POSITION_INDEPENDENT_CODE ON)

# ---------------------------------------------------------------- kernels
# msl_emu_add_kernels(<target> <file.metal>...): gen.py turns each .metal file into C++ at
# build time (rerun when the .metal file or a header next to it changes); the outputs are
# compiled as part of <target> with the MSL shim and the .metal file's directory on their
# include path (for its `#include "x.h"`).
function(msl_emu_add_kernels target)
  foreach(_metal IN LISTS ARGN)
    get_filename_component(_abs "${_metal}" ABSOLUTE)
    get_filename_component(_dir "${_abs}" DIRECTORY)
    get_filename_component(_name "${_abs}" NAME)
    file(GLOB _headers "${_dir}/*.h" "${_dir}/*.hpp")
    set(_out "${CMAKE_CURRENT_BINARY_DIR}/msl_emu_kernels/${target}/${_name}.cpp")
    add_custom_command(
      OUTPUT "${_out}"
      COMMAND "${Python3_EXECUTABLE}" "${MSL_EMU_GEN}" "${_abs}" "${_out}"
      MAIN_DEPENDENCY "${_abs}"
      DEPENDS ${_headers} "${MSL_EMU_GEN}"
      COMMENT "msl_emu: generating C++ from ${_name}"
      VERBATIM)
    target_sources(${target} PRIVATE "${_out}")
    set_source_files_properties("${_out}" PROPERTIES
      GENERATED TRUE
      INCLUDE_DIRECTORIES "${MSL_EMU_INCLUDE_DIR};${_dir}")
  endforeach()
  target_link_libraries(${target} PRIVATE msl_emu)
endfunction()
