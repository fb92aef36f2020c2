"""Hugging Face Hub repository ids as model paths ("google/gemma-3-1b-it"), as mlx-lm takes them:
the repository's config, safetensors and tokenizer files, fetched once into the Hub's own cache by
huggingface_hub (HF_HUB_OFFLINE=1: the cache only). GGUF repositories hold many files of one
model; their files are opened by path."""
from __future__ import annotations

import os
import re

# owner/name, as the Hub spells repository ids; never an absolute or ./ path
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9._-]+$")
FILES = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
         "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"]


def is_repo_id(path: str) -> bool:
    """A path that does not exist here and reads as a Hub repository id."""
    return bool(_REPO_ID.match(path)) and not os.path.exists(path)


def snapshot(repo_id: str) -> str:
    """The local directory of the repository's model files, fetched if the cache lacks them."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise FileNotFoundError(f"No such file or directory: '{repo_id}' (read as a Hugging Face Hub "
                                "repository id it needs the huggingface_hub package)") from None
    try:
        return snapshot_download(repo_id, allow_patterns=FILES)
    except Exception as e:  # offline, unknown repository, gated model, network errors
        raise FileNotFoundError(f"No such file or directory: '{repo_id}', and as a Hugging Face Hub "
                                f"repository it could not be fetched: {type(e).__name__}: {e}") from e
