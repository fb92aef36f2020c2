"""match_llamacpp on Gemma 4: the dense E2B layout (per-layer embeddings, KV sharing, sliding and
full layers with different head dims, proportional RoPE through llama.cpp's rope_freqs, final
softcap) and the 26B-A4B MoE layout (F32 router, softmax top-8 of 128 experts, per-expert output
scale, the dense MLP beside it): random-weight GGUFs of those shapes (bench/make_synthetic_gguf.py,
256-wide), run by llama.cpp (llama-cpp-python, live) and by MarkBase's CPU backend with
``match_llamacpp=True``.
Every row of logits must be llama.cpp's, bit for bit, over two micro-batches (past the 512-token
window), and greedy decoding must give llama.cpp's tokens.

Only where llama-cpp-python's native build runs its AVX2 kernels (x86-64 with AVX2, no AVX-512).
"""
import os
import sys

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")
import markbase  # noqa: E402

from test_llamacpp_gemma3 import LLAMACPP_AVX2_BUILD  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(not LLAMACPP_AVX2_BUILD,
                                reason="llama.cpp's AVX2 kernels only (this CPU has AVX-512 or no AVX2)")


@pytest.fixture(scope="module", params=[("e2b", "q8_0", 4), ("e2b", "q4_0", 4), ("26b-a4b", "q4_0", 2)],
                ids=["e2b-q8_0", "e2b-q4_0", "26b-a4b-q4_0"])
def e2b_file(request, tmp_path_factory):
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import make_synthetic_gguf as msg
    preset, qtype, layers = request.param
    path = tmp_path_factory.mktemp("g4exact") / f"{preset}-{qtype}.gguf"
    summary = msg.write_synthetic_gguf(str(path), preset=preset, layers=layers, vocab=8192, qtype=qtype,
                                       narrow=True, seed=3)
    yield str(path), summary
    path.unlink(missing_ok=True)


def _ids(summary, n):
    rng = np.random.default_rng(7)
    return [summary["bos_id"]] + [int(x) for x in rng.integers(summary["first_normal_token"], summary["vocab"], n - 1)]


def test_gemma4_e2b_logits_identical(e2b_file):
    path, summary = e2b_file
    ids = _ids(summary, 600)
    llm = llama_cpp.Llama(model_path=path, n_ctx=1024, n_batch=512, logits_all=True, n_threads=1,
                          n_threads_batch=2, seed=0, verbose=False)
    llm.reset()
    llm.eval(ids)
    want = np.array(llm.scores[: len(ids)])
    greedy = []
    llm.reset()
    llm.eval(ids[:40])
    while len(greedy) < 8:
        greedy.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([greedy[-1]])
    llm.close()
    m = markbase.Model.load(path, backend="cpu", threads=2, match_llamacpp=True)
    got = np.asarray(m.logits(ids))
    same = (got == want).all(axis=1)
    assert same.all(), (int(same.sum()), len(ids), float(np.abs(got - want).max()))
    assert [int(t) for t in m.generate_tokens(ids[:40], max_tokens=8, temperature=0)] == greedy
