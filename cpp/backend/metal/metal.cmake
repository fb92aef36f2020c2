# The Metal backend: metal-cpp host code (cpp/backend/metal) and the MSL kernels (metal/).
# On macOS it links Apple's Metal; with -DMARKBASE_METAL_EMU=ON (Linux, tests only) it links the
# emulated runtime of tests/metal_emu, which runs the same .metal sources on the CPU.
set(MARKBASE_METAL_KERNELS
  metal/embed.metal metal/norm.metal metal/elementwise.metal metal/rope.metal
  metal/kv_cache.metal metal/attention.metal metal/matvec.metal metal/matmul.metal metal/moe.metal)
set(MARKBASE_METAL_HEADERS metal/dequant.h metal/kernel_args.h)

# One source string with the headers inlined: what newLibraryWithSource compiles at load time
# when no metallib was built (and what the emulated runtime checks kernel names against).
set(_mb_src_cpp ${CMAKE_CURRENT_BINARY_DIR}/metal_kernel_source.cpp)
add_custom_command(
  OUTPUT ${_mb_src_cpp}
  COMMAND ${CMAKE_COMMAND} -DROOT=${CMAKE_CURRENT_SOURCE_DIR} -DOUT=${_mb_src_cpp}
          "-DHEADERS=${MARKBASE_METAL_HEADERS}" "-DKERNELS=${MARKBASE_METAL_KERNELS}"
          -P ${CMAKE_CURRENT_SOURCE_DIR}/cpp/backend/metal/embed_kernels.cmake
  DEPENDS ${MARKBASE_METAL_KERNELS} ${MARKBASE_METAL_HEADERS} cpp/backend/metal/embed_kernels.cmake
  WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}
  COMMENT "Embedding the Metal kernel sources"
  VERBATIM)

target_sources(markbase_core PRIVATE
  cpp/backend/metal/metal_device.cpp
  cpp/backend/metal/metal_backend.cpp
  cpp/backend/metal/metallib_path.cpp
  ${_mb_src_cpp})
target_compile_definitions(markbase_core PUBLIC MARKBASE_HAVE_METAL)

if(MARKBASE_METAL_EMU)
  target_compile_definitions(markbase_core PUBLIC MARKBASE_METAL_EMU)
  target_link_libraries(markbase_core PUBLIC msl_emu)
  # The kernels compiled to C++ register themselves from static initialisers: an OBJECT library
  # puts their objects straight into each program (a static archive would drop them as unused).
  add_library(markbase_metal_kernels OBJECT)
  set_target_properties(markbase_metal_kernels PROPERTIES POSITION_INDEPENDENT_CODE ON)
  msl_emu_add_kernels(markbase_metal_kernels ${MARKBASE_METAL_KERNELS})
else()
  # metal-cpp: Apple's headers, the same pinned copy as the Linux emulated build (pymetal-cpp
  # 0.1.5's, checked by sha256 in fetch_metal_cpp.py); -DMETAL_CPP_DIR=<path> uses a local copy.
  set(METAL_CPP_DIR "" CACHE PATH "metal-cpp directory (with Foundation/ and Metal/)")
  if(NOT METAL_CPP_DIR)
    find_package(Python3 COMPONENTS Interpreter REQUIRED)
    execute_process(
      COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/cpp/backend/metal/fetch_metal_cpp.py
              ${CMAKE_BINARY_DIR}/_deps/metal_cpp
      RESULT_VARIABLE _mb_rc OUTPUT_VARIABLE _mb_out ERROR_VARIABLE _mb_err
      OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT _mb_rc EQUAL 0)
      message(FATAL_ERROR "could not obtain metal-cpp:\n${_mb_err}")
    endif()
    set(METAL_CPP_DIR ${_mb_out})
  endif()
  target_include_directories(markbase_core PUBLIC ${METAL_CPP_DIR})
  target_sources(markbase_core PRIVATE cpp/backend/metal/metal_cpp_impl.cpp)
  target_link_libraries(markbase_core PUBLIC "-framework Metal" "-framework Foundation" "-framework QuartzCore")
  # Compile the kernels to a metallib now when Apple's compiler is here; else at load time.
  find_program(XCRUN xcrun)
  if(XCRUN)
    execute_process(COMMAND ${XCRUN} -sdk macosx -f metal RESULT_VARIABLE _mb_no_metal OUTPUT_QUIET ERROR_QUIET)
  endif()
  if(XCRUN AND _mb_no_metal EQUAL 0)
    set(_mb_lib ${CMAKE_CURRENT_BINARY_DIR}/markbase.metallib)
    set(_mb_airs)
    foreach(k ${MARKBASE_METAL_KERNELS})
      get_filename_component(_n ${k} NAME_WE)
      set(_air ${CMAKE_CURRENT_BINARY_DIR}/metal_air/${_n}.air)
      add_custom_command(OUTPUT ${_air}
        COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_CURRENT_BINARY_DIR}/metal_air
        COMMAND ${XCRUN} -sdk macosx metal -std=metal3.1 -fno-fast-math -I ${CMAKE_CURRENT_SOURCE_DIR}/metal
                -c ${CMAKE_CURRENT_SOURCE_DIR}/${k} -o ${_air}
        DEPENDS ${k} ${MARKBASE_METAL_HEADERS})
      list(APPEND _mb_airs ${_air})
    endforeach()
    add_custom_command(OUTPUT ${_mb_lib} COMMAND ${XCRUN} -sdk macosx metallib ${_mb_airs} -o ${_mb_lib}
                       DEPENDS ${_mb_airs})
    add_custom_target(markbase_metallib ALL DEPENDS ${_mb_lib})
    target_compile_definitions(markbase_core PRIVATE MARKBASE_METALLIB_NAME="markbase.metallib")
    if(SKBUILD)
      install(FILES ${_mb_lib} DESTINATION markbase)
    endif()
  endif()
endif()
