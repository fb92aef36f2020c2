"""markbase.open(): read a model file (GGUF or Hugging Face directory) without building a model."""
from __future__ import annotations

import os
from functools import cached_property
from typing import NamedTuple

import numpy as np

from . import _core


class TensorInfo(NamedTuple):
    type: str      # "F32", "Q4_K", ...
    shape: tuple   # numpy order: the shape read() returns
    nbytes: int    # bytes of the stored (possibly quantized) data


class ModelFileReader:
    """A GGUF file or a Hugging Face model directory, memory-mapped."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._f = _core.ModelFile(self.path)

    @property
    def kind(self) -> str:
        return "gguf" if self._f.is_gguf else "hf"

    @cached_property
    def metadata(self) -> dict:
        """Every GGUF metadata key, or the Hugging Face directory's config.json."""
        return self._f.metadata()

    @cached_property
    def tensors(self) -> dict[str, TensorInfo]:
        return {name: TensorInfo(t, tuple(shape), nbytes)
                for name, t, shape, nbytes in self._f.tensor_infos()}

    def read(self, name: str) -> np.ndarray:
        """The tensor dequantized to float32, in numpy order ((rows, cols) for a GGUF ne=[cols, rows])."""
        return self._f.read(name)

    def __repr__(self) -> str:
        return f"<markbase.open {self.kind} {self.path!r}: {len(self.tensors)} tensors>"


def open(path: str | os.PathLike) -> ModelFileReader:  # noqa: A001 (mirrors builtins.open)
    """Open a .gguf file or a Hugging Face directory (config.json + safetensors)."""
    return ModelFileReader(path)

