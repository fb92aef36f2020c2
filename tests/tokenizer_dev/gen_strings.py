"""Writes tests/data/tokenizer_strings.json: fixed strings for tests/test_tokenizer.py."""
import json
import pathlib

S = [
    "", " ", "  ", "   ", "\t", "\n", "\n\n", "\n\n\n", "\r\n", " \n", "\n ", "\t\n", "\n\t\t",
    "a", "A", "ab", "Hello", "Hello world", " Hello world", "Hello World!", "Hello, world!",
    " Hello, world!", "Hello  world", "Hello   world  ", "   leading and trailing   ",
    "The capital of France is", "The quick brown fox jumps over the lazy dog.",
    "I'm sure it's fine, isn't it? We'll see; they've said you're right.",
    "don't won't can't shouldn't y'all ' ' 're 've 's 'm",
    " ?", " !", " .", " ,", "a , b . c ! d ?", "x ' y", "rock 'n' roll",
    "1", "12", "123", "1234", "12345678901234567890", "3.14159", "1,000,000", "-42", "1e-10",
    "2024-01-31T12:34:56Z", "0x1F 0b1010 0o777",
    "éèêë", "naïve café résumé", "Äpfel", "ß ẞ", "e\u0301 vs é", "İstanbul ıi",
    "Ελληνικά γράμματα", "Привет, мир!", "нещо на Български", "שלום עולם", "مرحبا بالعالم",
    "नमस्ते दुनिया", "สวัสดีชาวโลก", "안녕하세요 세계", "こんにちは世界", "你好，世界！", "漢字と仮名",
    "ｆｕｌｌｗｉｄｔｈ　ｓｐａｃｅ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙", "½ ¼ ² ³ Ⅻ € £ ¥ © ®",
    "🦙", "🦙🦙🦙", "this is 🦙.cpp", "👍🏽 👨\u200d👩\u200d👧 🏳️\u200d🌈 ❤️", "emoji🎉in🎉text",
    "\u200b\u200c\u200d\ufeff", "\ufffd", "\ue000\uf8ff", "\U0010ffff", "\U00020000\U0002a6d6",
    "\x00", "a\x00b", "\x01\x02\x1f\x7f", "\u0085\u2028\u2029", "\u00a0\u3000\u2009",
    "▁", "▁▁", "▁hello", "a▁b c", "▁ ▁ ▁",
    "<start_of_turn>", "<end_of_turn>", "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>",
    "<start_of_image>", "<end_of_image>", "<start_of_image><end_of_image>",
    "text<start_of_image>text", " <start_of_image> ", "\n\n<start_of_image>\n\n",
    "<eos>", "<bos>", "<pad>", "<unk>", "<mask>", "</s>", "<s>", "<s>hi</s>", "[multimodal]",
    "<unused0>", "<unused99>", "<unused6241>", "<table><tr><td>1</td></tr></table>",
    "<h1>Title</h1>", "<b>bold</b> <i>it</i>", "<div class=\"x\">y</div>", "<a href=\"#\">l</a>",
    "<start_of", "of_turn>", "<start_of_turn", "<<start_of_turn>>", "<start_of_turn><start_of_turn>",
    "<|turn>user\nHi<turn|>\n<|turn>model\n", "<|tool_response>x<tool_response|>", "<|\"|>q<|\"|>",
    "<|channel>thought\n<channel|>", "<|image|>", "<|think|>", "<0x41>", "<0x0A>", "<0xZZ>",
    "<", ">", "</", "<|", "|>", "<>", "< >", "<<>>",
    "def f(x):\n    return x + 1\n", "if x:\n\tif y:\n\t\tpass\n",
    "int main(int argc, char** argv) {\n  printf(\"%d\\n\", argc);\n  return 0;\n}\n",
    "for (int i = 0; i < n; ++i) { a[i] = b[i] * c; }", "x->y; a::b; c <= d >= e != f == g",
    "SELECT id, name FROM users WHERE age > 30 ORDER BY name;", "#!/bin/bash\necho \"$HOME\"\n",
    "{\"key\": [1, 2, {\"nested\": null}], \"b\": true}", "https://example.com/path?q=1&r=2#frag",
    "user@example.com", "C:\\Windows\\System32", "~/.cache/huggingface", "$$ \\frac{a}{b} $$",
    "    indented with four spaces", "\t\ttabs then text", "trailing spaces    ", "trailing tab\t",
    "mixed \t \n \r\n whitespace", "\n" * 40, "\t" * 40, " " * 40, "\n \n \n", "a\n\n\n\nb",
    "a" * 100, "ab" * 60, "!" * 50, "=" * 80, "-" * 30 + "\n" + "-" * 30,
    "antidisestablishmentarianism", "Pneumonoultramicroscopicsilicovolcanoconiosis",
    "camelCaseIdentifier snake_case_identifier SCREAMING_CASE kebab-case",
    "The year 1999 was 25 years before 2024.", "Price: $19.99 (20% off!)",
    "Q: Why? A: Because.\n\nQ: How? A: Like this.",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut "
    "labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco.",
    "ied 4 ½ months", "w048 7tuijk dsdfhu", "🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅",
    "3333333333", "   Hello\n    Hello", "\n =", "' era", "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～",
]

out = pathlib.Path(__file__).resolve().parents[1] / "data" / "tokenizer_strings.json"
seen, uniq = set(), []
for s in S:
    if s not in seen:
        seen.add(s)
        uniq.append(s)
out.write_text(json.dumps({"strings": uniq}, ensure_ascii=True, indent=0) + "\n", encoding="utf-8")
print(len(uniq), "strings ->", out)
