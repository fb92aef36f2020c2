"""Self-tests of the emulated Metal runtime (tests/metal_emu/): the MSL shim and the fiber
runtime against C++ references in all three thread orders, the planted kernel bugs it must
catch, real metal-cpp host code on the fake Metal runtime, the selector coverage of that
runtime, and the CMake integration.

Builds with clang++-16 into a temporary directory (about 30 s on 2 cores, objects shared by
all tests). metal-cpp comes from METAL_CPP_DIR if set, else fetch_metal_cpp.py into pytest's
cache directory.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
EMU = os.path.join(HERE, "metal_emu")
SELFTEST = os.path.join(EMU, "selftest")
KERNELS = os.path.join(SELFTEST, "kernels")
CXX = shutil.which("clang++-16")

pytestmark = pytest.mark.skipif(CXX is None, reason="clang++-16 is not installed (Debian: apt-get install clang-16 libblocksruntime-dev)")

sys.path.insert(0, EMU)
import metal_cpp_selectors  # noqa: E402

RUNTIME_SRC = ["bindings", "dispatch", "errors", "fiber", "options", "registry", "threadgroup"]
FAKE_SRC = ["buffer", "commands", "counters", "device", "foundation", "library", "metal_cpp_impl", "objc_runtime"]


def run(cmd, **kw):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if r.returncode != 0:
        raise AssertionError("command failed (%d): %s\n%s" % (r.returncode, " ".join(cmd), r.stdout[-6000:]))
    return r.stdout


@pytest.fixture(scope="session")
def metal_cpp(request):
    d = os.environ.get("METAL_CPP_DIR")
    if d:
        return d
    cache = request.config.cache.mkdir("metal_cpp")
    return run([sys.executable, os.path.join(EMU, "..", "..", "cpp", "backend", "metal", "fetch_metal_cpp.py"), str(cache)]).strip().splitlines()[-1]


class Build:
    def __init__(self, out, metal_cpp):
        self.out = out
        self.metal_cpp = metal_cpp
        self.kernel_flags = ["-std=c++17", "-O1", "-g0", "-I" + os.path.join(EMU, "include"), "-I" + KERNELS]
        self.host_flags = ["-std=c++17", "-O1", "-g0", "-fblocks", "-I" + os.path.join(EMU, "include"),
                           "-I" + os.path.join(EMU, "fake_metal", "sdk"), "-I" + metal_cpp, "-I" + SELFTEST]

    def path(self, name):
        return os.path.join(self.out, name)

    def gen(self, metal):
        out = self.path(metal + ".cpp")
        run([sys.executable, os.path.join(EMU, "gen.py"), os.path.join(KERNELS, metal + ".metal"), out])
        return out

    def objects(self):
        """Everything compiled once, two compilers at a time."""
        jobs = []
        for k in ("ops", "bugs", "host"):
            src = self.gen(k)
            jobs.append([CXX] + self.kernel_flags + ["-c", src, "-o", self.path(k + ".o")])
        for s in RUNTIME_SRC:
            jobs.append([CXX] + self.kernel_flags + ["-c", os.path.join(EMU, "runtime", s + ".cpp"), "-o", self.path("rt_" + s + ".o")])
        for s in FAKE_SRC:
            jobs.append([CXX] + self.host_flags + ["-c", os.path.join(EMU, "fake_metal", s + ".cpp"), "-o", self.path("fm_" + s + ".o")])
        for s in ("test_ops", "test_bugs", "host_metal_cpp"):
            flags = self.host_flags if s == "host_metal_cpp" else self.kernel_flags + ["-I" + SELFTEST]
            jobs.append([CXX] + flags + ["-c", os.path.join(SELFTEST, s + ".cpp"), "-o", self.path(s + ".o")])
        with ThreadPoolExecutor(max_workers=2) as ex:
            list(ex.map(run, jobs))
        rt = [self.path("rt_" + s + ".o") for s in RUNTIME_SRC]
        fm = [self.path("fm_" + s + ".o") for s in FAKE_SRC]
        run([CXX, self.path("test_ops.o"), self.path("ops.o")] + rt + ["-o", self.path("test_ops"), "-lpthread"])
        run([CXX, self.path("test_bugs.o"), self.path("bugs.o"), self.path("ops.o")] + rt + ["-o", self.path("test_bugs"), "-lpthread"])
        run([CXX, self.path("host_metal_cpp.o"), self.path("host.o")] + fm + rt +
            ["-o", self.path("host_metal_cpp"), "-lBlocksRuntime", "-lpthread", "-ldl"])


@pytest.fixture(scope="session")
def build(tmp_path_factory, metal_cpp):
    b = Build(str(tmp_path_factory.mktemp("metal_emu")), metal_cpp)
    b.objects()
    return b


def run_checks(cmd, env=None):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=120)
    assert r.returncode == 0 and "0 failed" in r.stdout, r.stdout
    return r.stdout


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffle"])
def test_kernels_match_references(build, order):
    """Every builtin, collective and simdgroup-matrix op against a C++ reference, in one order
    (set through MSL_EMU_ORDER, so the environment variable is tested too)."""
    env = dict(os.environ, MSL_EMU_ORDER=order, MSL_EMU_SEED="12345")
    out = run_checks([build.path("test_ops")], env)
    assert out.startswith("order %s, seed 12345" % order)


def test_single_worker_and_ucontext_fallback(build):
    """The same checks on one worker thread, with the portable ucontext context switch."""
    flags = build.kernel_flags + ["-DMSL_EMU_UCONTEXT"]
    objs = []
    for s in ("fiber", "threadgroup"):
        o = build.path("uc_" + s + ".o")
        run([CXX] + flags + ["-c", os.path.join(EMU, "runtime", s + ".cpp"), "-o", o])
        objs.append(o)
    rt = [build.path("rt_" + s + ".o") for s in RUNTIME_SRC if s not in ("fiber", "threadgroup")]
    exe = build.path("test_ops_uc")
    run([CXX, build.path("test_ops.o"), build.path("ops.o")] + objs + rt + ["-o", exe, "-lpthread"])
    run_checks([exe], dict(os.environ, MSL_EMU_ORDER="shuffle", MSL_EMU_WORKERS="1"))


@pytest.mark.parametrize("case", ["missing_barrier", "early_return", "divergent_simd_sum", "split_simd_sum", "barrier_lines",
                                  "unbound_buffer", "tg_memory_limit", "set_bytes_limit", "threads_limit"])
def test_planted_bugs_are_caught(build, case):
    run_checks([build.path("test_bugs"), case])


def test_bad_environment_is_refused(build):
    r = subprocess.run([build.path("test_ops")], env=dict(os.environ, MSL_EMU_ORDER="backwards"),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert r.returncode != 0 and "MSL_EMU_ORDER=backwards is not valid" in r.stdout


def test_metal_cpp_host_code(build):
    """Real metal-cpp: buffers, pipelines, several dispatches incl. an indirect one sized by an
    earlier kernel of the same command buffer, one commit and one wait, counters, errors,
    Apple's limits and no-copy buffer alignment."""
    run_checks([build.path("host_metal_cpp"), "run", os.path.join(KERNELS, "host.metal")])


def test_unknown_selector_aborts_with_its_name(build):
    r = subprocess.run([build.path("host_metal_cpp"), "unknown"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert r.returncode == -signal.SIGABRT
    assert "[-MTLDevice newSharedEvent] not implemented by the fake Metal runtime" in r.stderr
    assert "returned" not in r.stdout


# What the engine's host code needs, from the task that specified the fake runtime.
REQUIRED = {
    "NSAutoreleasePool": ["+alloc", "-init", "-drain", "-release"],
    "NSString": ["+stringWithCString:encoding:", "-UTF8String", "-length", "-cStringUsingEncoding:", "-retain", "-release", "-autorelease"],
    "NSError": ["-localizedDescription", "-code", "-domain"],
    "NSURL": ["+fileURLWithPath:"],
    "NSDictionary": ["+dictionaryWithObjects:forKeys:count:"],
    "MTLDevice": ["-name", "-newCommandQueue", "-newCommandQueueWithMaxCommandBufferCount:", "-newBufferWithLength:options:",
                  "-newBufferWithBytes:length:options:", "-newBufferWithBytesNoCopy:length:options:deallocator:",
                  "-newLibraryWithSource:options:error:", "-newLibraryWithURL:error:", "-newDefaultLibrary",
                  "-newComputePipelineStateWithFunction:error:", "-maxThreadgroupMemoryLength", "-maxThreadsPerThreadgroup",
                  "-hasUnifiedMemory", "-recommendedMaxWorkingSetSize", "-supportsFamily:", "-currentAllocatedSize", "-registryID"],
    "MTLCompileOptions": ["+alloc", "-init", "-setFastMathEnabled:", "-setLanguageVersion:", "-setPreprocessorMacros:"],
    "MTLLibrary": ["-newFunctionWithName:", "-functionNames"],
    "MTLFunction": ["-name"],
    "MTLComputePipelineState": ["-maxTotalThreadsPerThreadgroup", "-threadExecutionWidth", "-staticThreadgroupMemoryLength"],
    "MTLBuffer": ["-contents", "-length", "-gpuAddress", "-didModifyRange:", "-setLabel:", "-storageMode"],
    "MTLCommandQueue": ["-commandBuffer", "-commandBufferWithUnretainedReferences"],
    "MTLCommandBuffer": ["-computeCommandEncoder", "-computeCommandEncoderWithDispatchType:", "-blitCommandEncoder", "-commit",
                         "-waitUntilCompleted", "-waitUntilScheduled", "-status", "-error", "-addCompletedHandler:", "-enqueue",
                         "-label", "-setLabel:"],
    "MTLComputeCommandEncoder": ["-setComputePipelineState:", "-setBuffer:offset:atIndex:", "-setBufferOffset:atIndex:",
                                 "-setBuffers:offsets:withRange:", "-setBytes:length:atIndex:", "-setThreadgroupMemoryLength:atIndex:",
                                 "-dispatchThreadgroups:threadsPerThreadgroup:", "-dispatchThreads:threadsPerThreadgroup:",
                                 "-dispatchThreadgroupsWithIndirectBuffer:indirectBufferOffset:threadsPerThreadgroup:",
                                 "-memoryBarrierWithScope:", "-memoryBarrierWithResources:count:", "-useResource:usage:",
                                 "-endEncoding", "-setLabel:"],
    "MTLBlitCommandEncoder": ["-copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:", "-fillBuffer:range:value:", "-endEncoding"],
}


def test_every_metal_cpp_selector_is_looked_up_correctly(build, tmp_path):
    """For each class the fake implements, every selector metal-cpp's headers can send to it
    resolves through that class: to an implementation, or to the exact "[-Class sel] not
    implemented" diagnosis. Every selector the fake implements is one metal-cpp really sends
    (a misspelt selector would never be reached), and the required ones are implemented."""
    sendable = metal_cpp_selectors.sendable(build.metal_cpp)
    listing = tmp_path / "selectors.txt"
    listing.write_text("".join("%s %s\n" % (c, s) for c in sorted(sendable) for s in sorted(sendable[c])))
    out = run([build.path("host_metal_cpp"), "selectors", str(listing)])
    result = {}
    for line in out.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[0] in sendable:
            result[(parts[0], parts[1])] = parts[2]
    assert len(result) == sum(len(v) for v in sendable.values())
    for (c, s), verdict in result.items():
        if verdict != "implemented":
            assert verdict == "[%s%s %s] not implemented by the fake Metal runtime" % (s[0], c, s[1:]), (c, s, verdict)
    missing = [(c, s) for c, sels in REQUIRED.items() for s in sels if result.get((c, s)) != "implemented"]
    assert not missing, missing

    methods = [line.split() for line in run([build.path("host_metal_cpp"), "methods"]).splitlines()]
    root = {"-" + s for s in metal_cpp_selectors.parse(build.metal_cpp)[0]["NS::Object"]} | {"+retain", "+release", "+autorelease"}
    stray = [(c, s) for c, s in methods if (c in sendable and s not in sendable[c]) or (c == "NSObject" and s not in root)]
    assert not stray, "implemented but never sent by metal-cpp: %s" % stray
    implemented = sum(v == "implemented" for v in result.values())
    print("%d of %d metal-cpp selectors of the supported classes are implemented" % (implemented, len(result)))


def test_cmake_integration(build, tmp_path):
    """metal_emu.cmake: the msl_emu library and msl_emu_add_kernels, used from a project the
    way the top-level CMakeLists uses it, with METAL_CPP_DIR given."""
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("cmake is not installed")
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(f"""
cmake_minimum_required(VERSION 3.20)
project(msl_emu_cmake_check LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 17)
include("{EMU}/metal_emu.cmake")
add_executable(host_check "{SELFTEST}/host_metal_cpp.cpp")
target_include_directories(host_check PRIVATE "{SELFTEST}")
msl_emu_add_kernels(host_check "{KERNELS}/host.metal")
""")
    bdir = tmp_path / "build"
    run([cmake, "-S", str(src), "-B", str(bdir), "-DCMAKE_CXX_COMPILER=" + CXX, "-DCMAKE_BUILD_TYPE=Release",
         "-DMETAL_CPP_DIR=" + build.metal_cpp])
    run([cmake, "--build", str(bdir), "-j2"])
    run_checks([str(bdir / "host_check"), "run", os.path.join(KERNELS, "host.metal")])
