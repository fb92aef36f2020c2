#!/usr/bin/env bash
# Makes the two folders h200_run.sh expects to be carried to the device machine (which has no
# network), both git-ignored through .git/info/exclude:
#   .whl/  transformers 5.23 and its dependencies as Python 3.12 x86-64 wheels (not numpy: the
#          device's torch has its own), for the tiny-model tests;
#   .gpu/llama.cpp-src.tar.gz  llama.cpp as vendored in the llama-cpp-python 0.3.36 sdist, without
#          its models, docs, tests and non-CUDA backends (~8 MB), for llama-bench built there.
# Run from the repository root, on a machine with access to PyPI (~1 minute).
set -euo pipefail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

rm -rf .whl && mkdir -p .whl
pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d .whl "transformers==5.23.*"
rm -f .whl/numpy-*.whl

# --no-binary on this one package only: a plain --no-binary=:all: would build cmake from source
pip download -q --no-deps --no-build-isolation --no-binary llama-cpp-python -d "$tmp" "llama-cpp-python==0.3.36"
tar xzf "$tmp"/llama_cpp_python-0.3.36.tar.gz -C "$tmp"
src=$(echo "$tmp"/llama_cpp_python-0.3.36/vendor/llama.cpp)
rm -rf "$src"/{models,docs,benches,tests,scripts,conversion,.github,media} "$src"/examples/*/
for b in "$src"/ggml/src/ggml-*/; do
  case "$b" in *ggml-cuda/|*ggml-cpu/) ;; *) [ -f "$b/CMakeLists.txt" ] && rm -rf "$b" ;; esac
done
mkdir -p .gpu && tar czf .gpu/llama.cpp-src.tar.gz -C "$(dirname "$src")" llama.cpp
mkdir -p .git/info
grep -qx ".whl/" .git/info/exclude 2>/dev/null || printf ".whl/\n.gpu/\n" >> .git/info/exclude
du -sh .whl .gpu
