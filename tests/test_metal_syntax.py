"""Static check of every .metal file: gen.py, then clang++-16 -fsyntax-only with
-DMSL_EMU_ADDRSPACE_CHECK, where device / constant / threadgroup are clang address spaces,
so the address-space errors that Metal rejects (and plain C++ would accept) fail here.

Covers the engine's metal/*.metal and the emulator's own self-test kernels (so that this test
never collects nothing), plus snippets that must fail the check.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EMU = os.path.join(HERE, "metal_emu")
CXX = shutil.which("clang++-16")

pytestmark = pytest.mark.skipif(CXX is None, reason="clang++-16 is not installed (Debian: apt-get install clang-16)")

METAL_FILES = sorted(glob.glob(os.path.join(ROOT, "metal", "*.metal"))) + sorted(
    glob.glob(os.path.join(EMU, "selftest", "kernels", "*.metal")))


def check(metal_path: str, out_dir: str) -> subprocess.CompletedProcess:
    """gen.py + the address-space syntax check; returns the failing step's result or the check's."""
    out = os.path.join(out_dir, os.path.basename(metal_path) + ".cpp")
    r = subprocess.run([sys.executable, os.path.join(EMU, "gen.py"), metal_path, out],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        return r
    return subprocess.run([CXX, "-std=c++17", "-fsyntax-only", "-DMSL_EMU_ADDRSPACE_CHECK", "-I" + os.path.join(EMU, "include"),
                           "-I" + os.path.dirname(os.path.abspath(metal_path)), out],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize("metal", METAL_FILES, ids=lambda p: os.path.relpath(p, ROOT))
def test_metal_file_passes_address_space_check(metal, tmp_path):
    r = check(metal, str(tmp_path))
    assert r.returncode == 0, r.stdout


BAD = {
    # a device pointer passed where a thread pointer is expected
    "device_as_thread": ("""
#include <metal_stdlib>
using namespace metal;
float sum4(thread const float * p) { return p[0] + p[1] + p[2] + p[3]; }
kernel void k(device const float * src [[buffer(0)]], device float * dst [[buffer(1)]],
              uint gid [[thread_position_in_grid]]) {
    dst[gid] = sum4(src + gid);
}
""", "no matching function for call to 'sum4'"),
    # a write through a constant pointer
    "write_constant": ("""
#include <metal_stdlib>
using namespace metal;
kernel void k(constant float * c [[buffer(0)]], uint gid [[thread_position_in_grid]]) {
    c[gid] = 1.0f;
}
""", "read-only variable is not assignable"),
    # a threadgroup pointer passed where a device pointer is expected
    "threadgroup_as_device": ("""
#include <metal_stdlib>
using namespace metal;
void store(device float * p, float v) { p[0] = v; }
kernel void k(device float * out [[buffer(0)]], uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float t[32];
    store(t + tid, 1.0f);
    out[tid] = t[tid];
}
""", "no matching function for call to 'store'"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_address_space_errors_fail_the_check(name, tmp_path):
    source, message = BAD[name]
    path = tmp_path / (name + ".metal")
    path.write_text(source)
    r = check(str(path), str(tmp_path))
    assert r.returncode != 0, "the check accepted a wrong kernel:\n" + source
    assert message in r.stdout, r.stdout
    assert name + ".metal:" in r.stdout  # reported at the .metal file's own line


GEN_ERRORS = {
    "no_attribute": ("kernel void k(device float * p, uint gid [[thread_position_in_grid]]) { p[gid] = 0; }",
                     "kernel parameter without an attribute"),
    "tg_initialiser": ("kernel void k(device float * p [[buffer(0)]]) { threadgroup float x = 0.0f; p[0] = x; }",
                       "has an initialiser"),
    "unknown_attribute": ("kernel void k(device float * p [[buffer(0)]], uint s [[sample_id]]) { p[0] = s; }",
                          "unsupported kernel parameter attribute [[sample_id]]"),
    "vector_c_cast": ("kernel void k(device float4 * p [[buffer(0)]], device int4 * q [[buffer(1)]]) { p[0] = (float4)q[0]; }",
                      "C-style cast to float4"),
}


@pytest.mark.parametrize("name", sorted(GEN_ERRORS))
def test_generator_rejects(name, tmp_path):
    body, message = GEN_ERRORS[name]
    path = tmp_path / (name + ".metal")
    path.write_text("#include <metal_stdlib>\nusing namespace metal;\n" + body + "\n")
    r = subprocess.run([sys.executable, os.path.join(EMU, "gen.py"), str(path), str(tmp_path / "out.cpp")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert r.returncode == 1 and message in r.stdout and name + ".metal:3: error:" in r.stdout, r.stdout
