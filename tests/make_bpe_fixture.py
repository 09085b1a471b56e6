#!/usr/bin/env python3
"""Writes the BPE tokenizer fixtures in tests/fixtures/bpe/ from PyPI's tiktoken.

  small.tiktoken          the first 3000 ranks of gpt2.tiktoken (a valid BPE vocabulary:
                          merges only make lower ranks), for CI, which has no tiktoken
  texts.hex               the hostile texts, one per line as "x" + hex (bytes survive exactly)
  expected_<set>.txt      per text: "o ids" (encode_ordinary) and "s ids" or "s =" (encode
                          with allowed_special="all"), for small.tiktoken under both
                          patterns and for the real gpt2 and llama3 files

Invalid UTF-8 follows tokenizer.h's rule: the text is cut into maximal valid UTF-8 runs and
invalid bytes; each run is encoded by tiktoken as a separate string, an invalid byte is its
single-byte token. (Python's strict decoder with surrogateescape marks exactly those bytes.)

Usage: /tmp/tkv/bin/python tests/make_bpe_fixture.py [--gpt2 PATH] [--llama3 PATH]
       [--exhaustive BUILD/tests/test_tokenizer]   (check every code point instead)
(default paths: $TS_TOKENIZER_DIR or ~/.cache/tessera/tokenizers, NAME.tiktoken)."""
import argparse
import hashlib
import os
import random
import sys

import tiktoken
import tiktoken.load

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "bpe")

GPT2_PAT = (r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s""")
# llama_models/llama3/tokenizer.py (llama-models 0.3.0)
LLAMA3_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = [
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
    "<|image|>",
] + [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - 12)]
SHA = {
    "gpt2": "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
    "llama3": "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55",
}
SMALL_RANKS = 3000


def curated():
    """Texts chosen to hit every place two regex engines or two tokenizers can differ."""
    t = [
        b"",
        b"Hello, world!",
        b"The quick brown fox jumps over the lazy dog.",
        "Caf\u00e9 na\u00efve fa\u00e7ade co\u00f6perate \u00c5ngstr\u00f6m \u0141\u00f3d\u017a".encode(),
        "e\u0301 a\u0308\u0323 n\u0303\u0303\u0303 \u0915\u094d\u0937 \u0e01\u0e33".encode(),
        "\u039a\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1 \u03ba\u03cc\u03c3\u03bc\u03b5".encode(),
        "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u0401\u0436".encode(),
        "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u0661\u0662\u0663\u0664".encode(),
        "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd".encode(),
        "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e \u0967\u0968\u0969".encode(),
        "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e0a\u0e32\u0e27\u0e42\u0e25\u0e01".encode(),
        "\u4f60\u597d\uff0c\u4e16\u754c\u3002\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8".encode(),
        "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8 \u1100\u1161\u11a8".encode(),
        "emoji \U0001F600\U0001F44D\U0001F3FD \U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466"
        " \U0001F1FA\U0001F1F8\U0001F1EF\U0001F1F5 \u2764\ufe0f \U0001F3F3\ufe0f\u200d\U0001F308".encode(),
        b"line one\r\nline two\r\n\r\nlone\rcarriage\rreturns\r",
        b"tabs\t\tand  spaces   \t \n  \n\n\n   x",
        "nbsp\u00a0\u00a0x ideographic\u3000\u3000y line\u2028sep para\u2029sep nel\u0085z"
        " thin\u2009\u202fnarrow \u205fmath \u1680ogham \u200bzwsp \u180emvs".encode(),
        b"trailing spaces   ",
        b"trailing newline\n",
        b"trailing mix \t\n ",
        "trailing nbsp\u00a0".encode(),
        "trailing nel\u0085".encode(),
        b"   ",
        b"\n",
        b"\n\n\n",
        b" \n",
        b"12345678901234567890123456789012345678901234567890 3.14159 1,000,000 0x1F 1e-9",
        "\u0661\u0662\u0663\u0664\u0665\u0666\u0667 \uff11\uff12\uff13\uff14\uff15 \u00b2\u00b3 \u00bd \u2167 \u3007".encode(),
        b"I'm you're we've they'll she'd it's don't",
        b"I'M YOU'RE WE'VE THEY'LL SHE'D IT'S DON'T 'S 'LL 'Ll 'lL 'sS",
        "long s: it'\u017f he'\u017f 'K '\u212a 'Ve 'rE".encode(),
        b"''' 's's 'x 'ss ' s",
        b'int main(void) {\n    printf("%d\\n", 42);\n    return 0;\n}\n',
        b"def f(x):\n\tif x > 0:\n\t\treturn [i**2 for i in range(x)]  # comment\n\treturn None\n",
        b'{"key": "value", "n": [1, 2.5, -3e10], "nested": {"a": null, "b": true}}',
        b"https://example.com/path/to/page?query=1&x=%20y#frag mailto:a@b.c",
        b"<|endoftext|>",
        b"before<|endoftext|>after",
        b"<|endoftext|><|endoftext|> <|endoftext|>\n",
        b"<|begin_of_text|>Hi<|eot_id|><|start_header_id|>user<|end_header_id|>",
        b"<|reserved_special_token_2|> <|reserved_special_token_245|> <|reserved_special_token_246|>",
        b"<|<|endoftext|>|> <|endoftext| <|not_special|> |><|",
        b"<|image|><|step_id|><|python_tag|>",
        b"NUL\x00byte\x00\x00end",
        b"\x00",
        # invalid UTF-8
        b"lone \x80 continuation \xbf",
        b"overlong \xc0\xaf \xe0\x80\xaf \xf0\x80\x80\xaf",
        b"surrogates \xed\xa0\x80 \xed\xbf\xbf",
        b"truncated \xe2\x82 and \xf0\x9f\x98 end \xc3",
        b"\xff\xfe\xfd",
        b"\xff",
        b"ok\xffok \xf5\x80\x80\x80 \xf4\x90\x80\x80 above",
        b"  \xff  ",
        b"word\xe2\x82\xacword \xe2\x82\xac\x80",
        b"<|endoftext|>\xff<|endoftext|>",
        b"\xc3\xa9\xc3",
        # long pieces (the heap merge)
        ("x" * 700).encode(),
        ("\u00e9" * 300).encode(),
        ("abcdefghij" * 40).encode(),
        ("1234567890" * 30).encode(),
        (" " * 500 + "x").encode(),
        ("!@#$%^&*()" * 30).encode(),
        ("\u4e2d\u6587" * 150).encode(),
        ("\U0001F600" * 120).encode(),
        ("a" * 129).encode(),
        ("ab" * 64).encode(),
        # letters and digits of Unicode 15 and 16 (PCRE2 10.42 has Unicode 14's tables)
        "Kawi \U00011F04\U00011F33 Garay \U00010D4A\U00010D85 \U00010D40\U00010D49 tje \u1C89\u1C8A"
        " \uA7CB\uA7DC Nag \U0001E4D0\U0001E4EB\U0001E4F0 CJK-H \U00031350\U000323AF"
        " \U0002EBF0\U0002EE5D \U00013460\U000143FA 9\U0001CCF0\U0001D2D3 x\U0001E5F0\U0001E5FA"
        " \U00016D40\U00016D79 '\U00011F04".encode(),
    ]
    return t


POOL = [
    " ", "  ", "\t", "\n", "\r", "\r\n", "\x0b", "\x0c", "\x85", "\xa0", "\u1680", "\u2000",
    "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\u200b", "\u180e", "\ufeff",
    "'", "'", "s", "S", "\u017f", "t", "T", "l", "L", "e", "E", "r", "R", "v", "V", "m", "M",
    "d", "D", "k", "K", "\u212a", "a", "z", "Q", "\u00e9", "e\u0301", "\u00df", "\u0130",
    "\u03a9", "\u044f", "\u0628", "\u05e9", "\u0915", "\u093f", "\u0e01", "\u0e31", "\u4e2d",
    "\ud55c", "\uff71", "\u01c5", "\u02b0", "\u3007", "\U0001D400", "0", "7", "9", "\u0663",
    "\uff11", "\u00b2", "\u00bd", "\u216b", "\U0001F600", "\U0001F44D\U0001F3FD", "\u200d",
    "\U0001F1FA", "!", ".", ",", "-", "_", "(", ")", "{", '"', "#", "$", "<|endoftext|>",
    "<|", "|>", "<|begin_of_text|>", "<|eot_id|>", "\x00", "\x7f", "\u0300", "\u20ac", "123",
    "4567", "hello", " the", "ing", "ll", "ve", "re",
]
BAD = [b"\x80", b"\xbf", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\xff", b"\xf4\x90\x80\x80",
       b"\xc3", b"\xf0\x9f\x98"]


def randomized():
    rng = random.Random(20261202)
    out = []
    for i in range(400):
        n = rng.randrange(0, 24)
        parts = [rng.choice(POOL).encode() for _ in range(n)]
        if i % 4 == 3 and n:
            for _ in range(rng.randrange(1, 3)):
                parts.insert(rng.randrange(0, len(parts) + 1), rng.choice(BAD))
        out.append(b"".join(parts))
    return out


def runs(data):
    """Maximal valid UTF-8 runs (str) and invalid bytes (int), in order."""
    s = data.decode("utf-8", errors="surrogateescape")
    out, cur = [], []
    for ch in s:
        if 0xDC80 <= ord(ch) <= 0xDCFF:
            if cur:
                out.append("".join(cur))
                cur = []
            out.append(ord(ch) - 0xDC00)
        else:
            cur.append(ch)
    if cur:
        out.append("".join(cur))
    return out


def encode(enc, ranks, data, special):
    ids = []
    for r in runs(data):
        if isinstance(r, int):
            ids.append(ranks[bytes([r])])
        elif special:
            ids.extend(enc.encode(r, allowed_special="all"))
        else:
            ids.extend(enc.encode_ordinary(r))
    return ids


def make_encoding(name, pat, ranks, specials):
    n = len(ranks)
    return tiktoken.Encoding(name, pat_str=pat, mergeable_ranks=ranks,
                             special_tokens={s: n + i for i, s in enumerate(specials)})


def write_expected(path, label, ranks_path, enc, ranks, texts):
    sha = hashlib.sha256(open(ranks_path, "rb").read()).hexdigest()
    lines = [f"# {label}: ranks {os.path.basename(ranks_path)} sha256 {sha}, "
             f"{len(texts)} texts (texts.hex), tiktoken {tiktoken.__version__}"]
    for t in texts:
        o = encode(enc, ranks, t, False)
        s = encode(enc, ranks, t, True)
        dec = b"".join(enc.decode_single_token_bytes(i) for i in o)
        assert dec == t, (t, o)
        lines.append("o " + " ".join(map(str, o)))
        lines.append("s =" if s == o else "s " + " ".join(map(str, s)))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {path}")


def exhaustive(binary, name, ranks_path, pat, specials):
    """Every code point (surrogates aside) in a few contexts through tiktoken and through
    `test_tokenizer --encode`: the pattern's classes must agree on each one."""
    import subprocess
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    texts = ["".join("x%c %c7%c!\n'%c" % (c, c, c, c) for c in cps[i:i + 64])
             for i in range(0, len(cps), 64)]
    ranks = tiktoken.load.load_tiktoken_bpe(ranks_path)
    want = make_encoding(name, pat, ranks, specials).encode_ordinary_batch(texts, num_threads=2)
    out = subprocess.run([binary, "--encode", name, ranks_path], check=True, capture_output=True,
                         text=True, input="".join(t.encode().hex() + "\n" for t in texts)).stdout
    got = [[int(x) for x in line.split()] for line in out.split("\n")[:len(texts)]]
    bad = [i for i in range(len(texts)) if got[i] != want[i]]
    print(f"{name}: every code point in context: {len(bad)} of {len(texts)} texts differ"
          + (f" (first: U+{cps[bad[0] * 64]:04X} ..)" if bad else ""))
    return not bad


def main():
    d = os.environ.get("TS_TOKENIZER_DIR") or os.path.expanduser("~/.cache/tessera/tokenizers")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpt2", default=os.path.join(d, "gpt2.tiktoken"))
    ap.add_argument("--llama3", default=os.path.join(d, "llama3.tiktoken"))
    ap.add_argument("--exhaustive", metavar="TEST_TOKENIZER",
                    help="instead of writing fixtures, compare every code point against "
                    "tiktoken through this test_tokenizer binary")
    a = ap.parse_args()
    for name, p in (("gpt2", a.gpt2), ("llama3", a.llama3)):
        if hashlib.sha256(open(p, "rb").read()).hexdigest() != SHA[name]:
            sys.exit(f"{p}: not the {name} ranks file (sha256 differs); run "
                     "scripts/fetch_tokenizers.sh")
    if a.exhaustive:
        ok = exhaustive(a.exhaustive, "gpt2", a.gpt2, GPT2_PAT, ["<|endoftext|>"])
        ok = exhaustive(a.exhaustive, "llama3", a.llama3, LLAMA3_PAT, LLAMA3_SPECIALS) and ok
        sys.exit(0 if ok else 1)
    os.makedirs(OUT, exist_ok=True)
    small = os.path.join(OUT, "small.tiktoken")
    with open(a.gpt2, "rb") as f:
        head = f.read().split(b"\n")[:SMALL_RANKS]
    with open(small, "wb") as f:
        f.write(b"\n".join(head) + b"\n")
    texts = curated() + randomized()
    with open(os.path.join(OUT, "texts.hex"), "w") as f:
        f.write("".join("x" + t.hex() + "\n" for t in texts))
    sr = tiktoken.load.load_tiktoken_bpe(small)
    assert len(sr) == SMALL_RANKS
    write_expected(os.path.join(OUT, "expected_small_gpt2.txt"), "small gpt2", small,
                   make_encoding("small_gpt2", GPT2_PAT, sr, ["<|endoftext|>"]), sr, texts)
    write_expected(os.path.join(OUT, "expected_small_llama3.txt"), "small llama3", small,
                   make_encoding("small_llama3", LLAMA3_PAT, sr, LLAMA3_SPECIALS), sr, texts)
    gr = tiktoken.load.load_tiktoken_bpe(a.gpt2)
    write_expected(os.path.join(OUT, "expected_gpt2.txt"), "gpt2", a.gpt2,
                   make_encoding("gpt2", GPT2_PAT, gr, ["<|endoftext|>"]), gr, texts)
    lr = tiktoken.load.load_tiktoken_bpe(a.llama3)
    write_expected(os.path.join(OUT, "expected_llama3.txt"), "llama3", a.llama3,
                   make_encoding("llama3", LLAMA3_PAT, lr, LLAMA3_SPECIALS), lr, texts)


if __name__ == "__main__":
    main()
