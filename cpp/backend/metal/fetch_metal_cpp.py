#!/usr/bin/env python3
"""fetch_metal_cpp.py DEST_DIR -- put Apple's metal-cpp headers (367.4.2) in DEST_DIR/metal-cpp.

Apple's own download site is not reachable from CI, so the headers come from the only copy on
a package registry: the sdist of the PyPI package pymetal-cpp 0.1.5, which carries them in
thirdparty/metal-cpp (Apache-2.0, as Apple publishes them). The sdist is only a carrier: it is
downloaded with `pip download --no-deps`, checked against a pinned sha256, and never built or
installed. metal-cpp must never be committed to this repository.

Prints the metal-cpp directory on success; exits non-zero with a message otherwise. A second
run with the headers already in place does nothing.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

PACKAGE = "pymetal-cpp==0.1.5"
SDIST = "pymetal_cpp-0.1.5.tar.gz"
SHA256 = "1118062f635277a2781659fbc4e7e5bac7d565d6948a3461c3b04d6425c15a0e"
INNER = "pymetal_cpp-0.1.5/thirdparty/metal-cpp/"
MARKER = os.path.join("Metal", "Metal.hpp")


def fail(msg: str) -> int:
    print("fetch_metal_cpp: error: " + msg, file=sys.stderr)
    print("fetch_metal_cpp: pass -DMETAL_CPP_DIR=<dir with Foundation/ and Metal/> to use a local copy", file=sys.stderr)
    return 1


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n")[0], file=sys.stderr)
        return 2
    dest = os.path.abspath(argv[1])
    out = os.path.join(dest, "metal-cpp")
    if os.path.isfile(os.path.join(out, MARKER)):
        print(out)
        return 0
    os.makedirs(dest, exist_ok=True)
    sdist = os.path.join(dest, SDIST)
    if not os.path.isfile(sdist):
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", dest, PACKAGE]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0 or not os.path.isfile(sdist):
            return fail("'%s' failed:\n%s" % (" ".join(cmd), r.stdout[-2000:]))
    with open(sdist, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != SHA256:
        return fail("%s has sha256 %s, expected %s (the package changed: check it before trusting it)" % (sdist, digest, SHA256))
    tmp = tempfile.mkdtemp(dir=dest)
    try:
        with tarfile.open(sdist, "r:gz") as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(INNER) and (m.isfile() or m.isdir())]
            for m in members:
                if ".." in m.name.split("/") or m.name.startswith("/"):
                    return fail("unsafe path in the archive: " + m.name)
            if not members:
                return fail("%s has no %s" % (sdist, INNER))
            tar.extractall(tmp, members=members)
        src = os.path.join(tmp, INNER)
        if not os.path.isfile(os.path.join(src, MARKER)):
            return fail("%s lacks %s" % (sdist, INNER + MARKER))
        if os.path.exists(out):
            shutil.rmtree(out)
        os.replace(src, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
