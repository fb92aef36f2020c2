"""Shared pytest fixtures.

The tiny-model fixtures build random-weight Gemma 3 / Gemma 4 models with transformers' own
classes (tests/tiny_gemma.py) once per session, into a temporary directory. torch and transformers
are imported inside the fixtures only, so test files that do not use them never pay for (or need)
those imports.
"""
from __future__ import annotations

import os
import sys

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:  # so that `import tiny_gemma` works under any --import-mode
    sys.path.insert(0, TESTS_DIR)

# name -> (kind, layout); the *_cg directories hold the same weights as their causal sibling in
# the published multimodal layout (Gemma4ForConditionalGeneration, model.language_model.*;
# Gemma3ForConditionalGeneration, language_model.model.*).
TINY_MODELS = {
    "gemma3": ("gemma3", "causal"),
    "gemma3_cg": ("gemma3", "conditional"),
    "gemma4": ("gemma4", "causal"),
    "gemma4_cg": ("gemma4", "conditional"),
    "gemma4_moe": ("gemma4_moe", "causal"),
    "gemma4_moe_cg": ("gemma4_moe", "conditional"),
}


class TinyModel:
    """One saved tiny model directory plus its transformers reference (memoised)."""

    def __init__(self, name: str, kind: str, layout: str, path: str, sibling: "TinyModel | None"):
        self.name, self.kind, self.layout, self.path = name, kind, layout, path
        self._sibling = sibling  # the causal model with the same weights (prompt choice shared)
        self._hf = None
        self._memo: dict = {}

    @property
    def hf(self):
        """The transformers model loaded back from self.path (float32, eager attention)."""
        if self._hf is None:
            import tiny_gemma

            self._hf = tiny_gemma.load_hf(self.path)
        return self._hf

    @property
    def config(self):
        import tiny_gemma

        return tiny_gemma.text_config(self.hf)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def window(self) -> int:
        return self.config.sliding_window

    def logits(self, ids) -> "numpy.ndarray":  # noqa: F821
        key = ("logits", tuple(ids))
        if key not in self._memo:
            import tiny_gemma

            self._memo[key] = tiny_gemma.hf_logits(self.hf, ids)
        return self._memo[key]

    def greedy(self, ids, n: int) -> list[int]:
        key = ("greedy", tuple(ids), n)
        if key not in self._memo:
            import tiny_gemma

            self._memo[key] = tiny_gemma.hf_greedy(self.hf, ids, n)
        return self._memo[key]

    def prompt(self, length: int, n_new: int) -> list[int]:
        """A deterministic prompt of `length` ids (BOS first) chosen by tiny_gemma.pick_prompt:
        its greedy continuation of n_new tokens has no special ids and no near-ties."""
        key = ("prompt", length, n_new)
        if key not in self._memo:
            if self._sibling is not None:
                ids = self._sibling.prompt(length, n_new)
            else:
                import tiny_gemma

                ids, toks, _ = tiny_gemma.pick_prompt(self.hf, length, n_new, seed=length)
                self._memo[("greedy", tuple(ids), n_new)] = toks
            self._memo[key] = ids
        return self._memo[key]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """Directory holding every tiny model of TINY_MODELS, built once per session."""
    import tiny_gemma

    out = tmp_path_factory.mktemp("tiny_gemma")
    paths = tiny_gemma.build_all(str(out))
    assert set(paths) == set(TINY_MODELS), paths
    return str(out)


@pytest.fixture(scope="session")
def tiny_models(tiny_model_dir) -> dict[str, TinyModel]:
    """name -> TinyModel for every entry of TINY_MODELS."""
    models: dict[str, TinyModel] = {}
    for name, (kind, layout) in TINY_MODELS.items():  # causal entries come before their _cg
        sibling = models.get(kind) if layout == "conditional" else None
        models[name] = TinyModel(name, kind, layout, os.path.join(tiny_model_dir, name), sibling)
    return models


@pytest.fixture(scope="session")
def markbase_module():
    """The markbase package (an import failure is an error, not a skip)."""
    import markbase

    return markbase
