"""The engine's correctness tests on the CPU backend's portable path as well as on the SIMD path
this machine picked: the transformers comparisons (tests/test_transformers_parity.py) run again in
a child pytest with MARKBASE_SIMD=portable (the dispatcher reads it once per process). The
kernel-level tests cover each SIMD path against numpy (tests/test_cpu_kernels.py, and
tests/test_cpu_neon.py for AArch64 under qemu)."""
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_transformers_parity_on_the_portable_path():
    env = dict(os.environ, MARKBASE_SIMD="portable")
    path = subprocess.run([sys.executable, "-c", "import markbase; print(markbase._core.simd_path())"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert path.stdout.strip() == "portable", path.stderr
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(HERE / "test_transformers_parity.py")],
                       capture_output=True, text=True, env=env, timeout=1200, cwd=HERE.parent)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
