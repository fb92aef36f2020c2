// library.cpp -- MTLCompileOptions, MTLLibrary, MTLFunction, MTLComputePipelineDescriptor and
// MTLComputePipelineState, with the MTLDevice methods that make them.
//
// Nothing is compiled at run time: the .metal files were compiled into the program through
// gen.py, and their kernels are in the msl_emu registry. A library made from source text
// "contains" the kernels that text defines; each must be in the registry, otherwise the
// library fails the way a compile error would (nil + NSError), naming the missing kernels.
#include <cctype>
#include <fstream>
#include <sstream>

#include "install.h"
#include "metal_objects.h"

namespace fake_objc {

namespace {
bool is_ident(char c) { return std::isalnum((unsigned char)c) || c == '_'; }

std::string blank_comments(const std::string& s) {
  std::string o = s;
  for (size_t i = 0; i + 1 < o.size();) {
    if (o[i] == '/' && o[i + 1] == '/') {
      while (i < o.size() && o[i] != '\n') o[i++] = ' ';
    } else if (o[i] == '/' && o[i + 1] == '*') {
      size_t e = o.find("*/", i + 2);
      e = e == std::string::npos ? o.size() : e + 2;
      for (; i < e; ++i)
        if (o[i] != '\n') o[i] = ' ';
    } else {
      ++i;
    }
  }
  return o;
}

// The end of the text before position p, skipping whitespace and [[...]] attributes.
char previous_significant(const std::string& s, size_t p) {
  while (p > 0) {
    char c = s[p - 1];
    if (std::isspace((unsigned char)c)) {
      --p;
    } else if (c == ']' && p >= 2 && s[p - 2] == ']') {
      size_t open = s.rfind("[[", p - 2);
      if (open == std::string::npos) return c;
      p = open;
    } else {
      return c;
    }
  }
  return 0;
}
}  // namespace

std::set<std::string> kernel_names_in_source(const std::string& source) {
  std::set<std::string> names;
  const std::string s = blank_comments(source);
  for (size_t p = s.find("kernel"); p != std::string::npos; p = s.find("kernel", p + 6)) {
    if ((p > 0 && is_ident(s[p - 1])) || (p + 6 < s.size() && is_ident(s[p + 6]))) continue;
    size_t q = p + 6;
    while (q < s.size() && std::isspace((unsigned char)s[q])) ++q;
    if (s.compare(q, 4, "void") != 0 || (q + 4 < s.size() && is_ident(s[q + 4]))) continue;
    q += 4;
    while (q < s.size() && std::isspace((unsigned char)s[q])) ++q;
    size_t b = q;
    while (q < s.size() && is_ident(s[q])) ++q;
    if (q == b) continue;
    std::string name = s.substr(b, q - b);
    while (q < s.size() && std::isspace((unsigned char)s[q])) ++q;
    if (q >= s.size() || s[q] != '(') continue;
    if (previous_significant(s, p) == '>') continue;  // a template: only its host_name instances count
    names.insert(name);
  }
  const std::string h = "host_name";
  for (size_t p = s.find(h); p != std::string::npos; p = s.find(h, p + h.size())) {
    size_t q = s.find('"', p);
    size_t e = q == std::string::npos ? q : s.find('"', q + 1);
    if (e == std::string::npos) break;
    names.insert(s.substr(q + 1, e - q - 1));
  }
  return names;
}

namespace {

void set_error(Object** error, FError* e) {
  if (error) *error = autorelease(e);
  else release(e);
}

// A library over `names`, or nil + error when some aren't compiled into the program.
FLibrary* new_library(const std::set<std::string>& names, const char* what, Object** error) {
  std::string missing;
  for (const std::string& n : names)
    if (!msl_emu::find_kernel(n)) missing += (missing.empty() ? "" : ", ") + n;
  if (!missing.empty()) {
    set_error(error, new_error("MTLLibraryErrorDomain", 3 /* MTLLibraryErrorCompileFailure */,
                               std::string("fake Metal: ") + what + " defines kernels that are not compiled into this program: " +
                                   missing + " (add their .metal file with msl_emu_add_kernels)"));
    return nullptr;
  }
  FLibrary* l = make<FLibrary>("MTLLibrary");
  l->names = names;
  return l;
}

FPipeline* new_pipeline(FFunction* f, UInt max_threads, Object** error) {
  if (!f) {
    set_error(error, new_error("MTLLibraryErrorDomain", 1, "fake Metal: a compute pipeline needs a function (got nil)"));
    return nullptr;
  }
  FPipeline* p = make<FPipeline>("MTLComputePipelineState");
  p->kernel = f->kernel;
  if (max_threads && max_threads < f->kernel->max_total_threads) {
    // The descriptor's limit lowers the kernel's, as in Metal: keep a private copy of the entry.
    auto* k = new msl_emu::Kernel(*f->kernel);  // lives as long as the program (few pipelines)
    k->max_total_threads = (uint32_t)max_threads;
    p->kernel = k;
  }
  return p;
}

template <class T> void label_methods(const char* c) {
  instance_method(c, "label", +[](T* o, SEL) { return o->label; });
  instance_method(c, "setLabel:", +[](T* o, SEL, Object* l) {
    retain(l);
    release(o->label);
    o->label = l;
  });
}

struct FPipelineDescriptor : Object {
  FFunction* function = nullptr;
  Object* label = nullptr;
  UInt max_threads = 0;
  bool multiple_of_width = false;
  ~FPipelineDescriptor() override {
    release(function);
    release(label);
  }
};

}  // namespace

void install_library() {
  // ---- MTLCompileOptions: accepted and kept; the kernels were compiled at build time, so the
  // options can't change them (the emulator has one precision; macros can't be re-applied).
  const char* O = "MTLCompileOptions";
  class_method(O, "alloc", +[](void*, SEL) { return make<FCompileOptions>("MTLCompileOptions"); });
  instance_method(O, "init", +[](FCompileOptions* o, SEL) { return o; });
  instance_method(O, "fastMathEnabled", +[](FCompileOptions* o, SEL) { return o->fast_math; });
  instance_method(O, "setFastMathEnabled:", +[](FCompileOptions* o, SEL, bool v) { o->fast_math = v; });
  instance_method(O, "mathMode", +[](FCompileOptions* o, SEL) { return o->math_mode; });
  instance_method(O, "setMathMode:", +[](FCompileOptions* o, SEL, Int v) { o->math_mode = v; });
  instance_method(O, "languageVersion", +[](FCompileOptions* o, SEL) { return o->language_version; });
  instance_method(O, "setLanguageVersion:", +[](FCompileOptions* o, SEL, UInt v) { o->language_version = v; });
  instance_method(O, "preprocessorMacros", +[](FCompileOptions* o, SEL) { return o->macros; });
  instance_method(O, "setPreprocessorMacros:", +[](FCompileOptions* o, SEL, Object* d) {
    retain(d);
    release(o->macros);
    o->macros = d;
  });

  // ---- MTLDevice: libraries and pipelines
  const char* D = "MTLDevice";
  instance_method(D, "newLibraryWithSource:options:error:", +[](FDevice*, SEL, Object* source, Object*, Object** error) {
    return new_library(kernel_names_in_source(std::string(string_text(source))), "the library source", error);
  });
  // A .metallib can't exist in an emulated build: the file at the URL is read as MSL source
  // text (point it at the .metal file, or at a text file that lists `kernel void name(`).
  instance_method(D, "newLibraryWithURL:error:", +[](FDevice*, SEL, FURL* url, Object** error) -> FLibrary* {
    std::ifstream f(url ? url->path : std::string());
    if (!f) {
      set_error(error, new_error("MTLLibraryErrorDomain", 6 /* MTLLibraryErrorFileNotFound */,
                                 "fake Metal: cannot open library file '" + (url ? url->path : std::string("(nil)")) + "'"));
      return nullptr;
    }
    std::stringstream ss;
    ss << f.rdbuf();
    return new_library(kernel_names_in_source(ss.str()), "the library file", error);
  });
  instance_method(D, "newDefaultLibrary", +[](FDevice*, SEL) {
    std::vector<std::string> all = msl_emu::kernel_names();
    return new_library(std::set<std::string>(all.begin(), all.end()), "the default library", nullptr);
  });
  instance_method(D, "newComputePipelineStateWithFunction:error:", +[](FDevice*, SEL, FFunction* f, Object** error) {
    return new_pipeline(f, 0, error);
  });
  // Reflection is not provided: *reflection is set to nil.
  instance_method(D, "newComputePipelineStateWithFunction:options:reflection:error:",
                  +[](FDevice*, SEL, FFunction* f, UInt, Object** reflection, Object** error) {
                    if (reflection) *reflection = nullptr;
                    return new_pipeline(f, 0, error);
                  });
  instance_method(D, "newComputePipelineStateWithDescriptor:options:reflection:error:",
                  +[](FDevice*, SEL, FPipelineDescriptor* d, UInt, Object** reflection, Object** error) -> FPipeline* {
                    if (reflection) *reflection = nullptr;
                    FPipeline* p = new_pipeline(d ? d->function : nullptr, d ? d->max_threads : 0, error);
                    if (p && d && d->label) {
                      retain(d->label);
                      p->label = d->label;
                    }
                    return p;
                  });

  // ---- MTLComputePipelineDescriptor
  const char* PD = "MTLComputePipelineDescriptor";
  class_method(PD, "alloc", +[](void*, SEL) { return make<FPipelineDescriptor>("MTLComputePipelineDescriptor"); });
  instance_method(PD, "init", +[](FPipelineDescriptor* d, SEL) { return d; });
  instance_method(PD, "computeFunction", +[](FPipelineDescriptor* d, SEL) { return d->function; });
  instance_method(PD, "setComputeFunction:", +[](FPipelineDescriptor* d, SEL, FFunction* f) {
    retain(f);
    release(d->function);
    d->function = f;
  });
  instance_method(PD, "maxTotalThreadsPerThreadgroup", +[](FPipelineDescriptor* d, SEL) { return d->max_threads; });
  instance_method(PD, "setMaxTotalThreadsPerThreadgroup:", +[](FPipelineDescriptor* d, SEL, UInt n) { d->max_threads = n; });
  instance_method(PD, "threadGroupSizeIsMultipleOfThreadExecutionWidth", +[](FPipelineDescriptor* d, SEL) { return d->multiple_of_width; });
  instance_method(PD, "setThreadGroupSizeIsMultipleOfThreadExecutionWidth:", +[](FPipelineDescriptor* d, SEL, bool v) { d->multiple_of_width = v; });
  label_methods<FPipelineDescriptor>(PD);

  // ---- MTLLibrary
  const char* L = "MTLLibrary";
  instance_method(L, "newFunctionWithName:", +[](FLibrary* l, SEL, Object* name) -> FFunction* {
    std::string n(string_text(name));
    if (!l->names.count(n)) return nullptr;  // Metal: nil for a name the library doesn't define
    FFunction* f = make<FFunction>("MTLFunction");
    f->kernel = msl_emu::find_kernel(n);
    return f;
  });
  instance_method(L, "functionNames", +[](FLibrary* l, SEL) {
    std::vector<Object*> v;
    for (const std::string& n : l->names) v.push_back(temp_string(n));
    return autorelease(new_array(v));
  });
  instance_method(L, "device", +[](FLibrary*, SEL) { return the_device(); });
  label_methods<FLibrary>(L);

  // ---- MTLFunction
  const char* F = "MTLFunction";
  instance_method(F, "name", +[](FFunction* f, SEL) { return temp_string(f->kernel->name); });
  instance_method(F, "functionType", +[](FFunction*, SEL) { return (UInt)3; /* MTLFunctionTypeKernel */ });
  instance_method(F, "device", +[](FFunction*, SEL) { return the_device(); });
  label_methods<FFunction>(F);

  // ---- MTLComputePipelineState
  const char* P = "MTLComputePipelineState";
  instance_method(P, "maxTotalThreadsPerThreadgroup", +[](FPipeline* p, SEL) { return p->max_threads(); });
  instance_method(P, "threadExecutionWidth", +[](FPipeline*, SEL) { return (UInt)msl_emu::kSimdWidth; });
  instance_method(P, "staticThreadgroupMemoryLength", +[](FPipeline* p, SEL) { return (UInt)p->kernel->static_tg_bytes; });
  instance_method(P, "device", +[](FPipeline*, SEL) { return the_device(); });
  instance_method(P, "label", +[](FPipeline* p, SEL) { return p->label; });
}

}  // namespace fake_objc
