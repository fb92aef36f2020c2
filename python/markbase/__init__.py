"""MarkBase: fast, checked inference of Gemma 3 and Gemma 4 models.

    import markbase
    m = markbase.Model.load("model.gguf")        # or a Hugging Face directory, or None
    print(m.generate("The capital of France is", max_tokens=16, temperature=0))
"""
from ._core import BackendError, FormatError, Tokenizer
from .files import ModelFileReader, TensorInfo, open
from .model import Model

__all__ = ["Model", "Tokenizer", "open", "TensorInfo", "ModelFileReader", "FormatError", "BackendError"]
__version__ = "0.1.0"
