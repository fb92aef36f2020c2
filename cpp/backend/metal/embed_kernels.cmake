# Writes OUT: a C++ file holding the Metal kernels as one string (headers inlined, in order).
set(text "")
foreach(f ${HEADERS} ${KERNELS})
  file(READ ${ROOT}/${f} body)
  string(REGEX REPLACE "#include \"[a-z_]+\\.h\"" "" body "${body}")
  string(APPEND text "// ---- ${f}\n${body}\n")
endforeach()
file(WRITE ${OUT} "// Generated from metal/ by cpp/backend/metal/embed_kernels.cmake. Do not edit.\n"
  "#include \"backend/metal/metal_device.h\"\n"
  "namespace markbase::metal {\n"
  "const char* const kKernelSource = R\"MBKERNELS(${text})MBKERNELS\";\n"
  "}\n")
