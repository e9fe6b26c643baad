#!/usr/bin/env python3
"""Generate tests/data/tokenizer_corpus.jsonl, the tokenizer test corpus.

    /usr/bin/python3 tests/data/make_tokenizer_corpus.py            # rewrite the corpus
    /usr/bin/python3 tests/data/make_tokenizer_corpus.py --stats    # also print category counts

Deterministic (fixed seed, no network, standard library only). The output is
one JSON string literal per line, in a fixed order. Characters that are
invisible or that some line-oriented readers treat as line breaks (C0/C1
controls, format characters, U+2028/U+2029, non-ASCII spaces, private use,
BOM) are written as \\uXXXX escapes in the BMP; everything else is raw UTF-8.
Astral characters are always raw UTF-8 (never surrogate-pair escapes).

The corpus deliberately contains no U+0000 and no lone surrogates: they do not
survive every JSON / N-API path between the test and the reference tokenizer.

Both this script and its output are committed; rerun it after editing and
commit the regenerated .jsonl. The category of each line is not stored in the
corpus; run with --stats to see the counts.
"""

import json
import os
import random
import sys
import unicodedata

SEED = 20240611
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer_corpus.jsonl")

cases = []  # (category, string)


def add(cat, *strings):
    for s in strings:
        cases.append((cat, s))


# ---------------------------------------------------------------- empty
add("empty", "")

# ---------------------------------------------------------------- English prose
add("prose",
    "Hello, world!",
    "Hello world",
    "hello",
    "Hello",
    " Hello",
    "HELLO WORLD",
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness.",
    "Call me Ishmael. Some years ago\u2014never mind how long precisely\u2014having little or no money in my purse, "
    "and nothing particular to interest me on shore, I thought I would sail about a little and see the watery part of the world.",
    "In 1969, Neil Armstrong became the first person to walk on the Moon; he said: \"That's one small step for [a] man, one giant leap for mankind.\"",
    "Tokenization splits text into subword units, which are then mapped to integer ids.",
    "Please summarize the following article in three bullet points.",
    "What is the capital of France? The capital of France is Paris.",
    "Dr. Smith arrived at 3 p.m. on Tuesday, Jan. 5th, with the results (see Fig. 2, p. 14).",
    "A sentence.\nAnother sentence.\n\nA new paragraph after a blank line.",
    "Mr. and Mrs. Dursley, of number four, Privet Drive, were proud to say that they were perfectly normal, thank you very much.",
    "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis supercalifragilisticexpialidocious",
    "e.g. i.e. etc. vs. a.k.a. U.S.A. Ph.D.",
    "CamelCaseIdentifier snake_case_identifier kebab-case-identifier SCREAMING_SNAKE_CASE",
    "The year 2024 had 366 days; 2023 had 365.",
    "Once upon a time, there was a little tokenizer who wanted to see the world.",
    "\"Quoted,\" she said, 'single quoted,' and \u201csmart quoted\u201d and \u2018single smart\u2019.",
    "Caf\u00e9, na\u00efve, r\u00e9sum\u00e9, co\u00f6perate, fa\u00e7ade, jalape\u00f1o, \u00fcber, Stra\u00dfe, \u00e6sthetic, \u00f8re.",
    "The results were, frankly, astonishing -- nobody expected them; not even the authors...",
    "ALL CAPS SENTENCES ARE SHOUTY AND TOKENIZE DIFFERENTLY THAN lower case ones.",
    "tHiS iS sPoNgEbOb CaSe TeXt",
    "Question? Answer! Exclamation!! Interrobang?! Ellipsis\u2026",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua.",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z",
    "A",
    "a",
    "I",
    ".",
)

rng = random.Random(SEED)
WORDS = ("the of and to in is was for on that with as by at from his her it an are were be this which or had "
         "not but have they one all their there been has when who will more no if out so said what up its about "
         "into than them can only other new some could time these two may then do first any my now such like our "
         "over man me even most made after also did many before must through back years where much your way well "
         "down should because each just those people how too little state good very make world still own see men "
         "work long get here between both life being under never day same another know while last might us great "
         "old year off come since against go came right used take three tokenizer merges vocabulary byte pair").split()
for i in range(12):
    n = rng.randint(5, 40)
    words = [rng.choice(WORDS) for _ in range(n)]
    words[0] = words[0].capitalize()
    s = " ".join(words)
    # sprinkle punctuation
    out = []
    for w in s.split(" "):
        r = rng.random()
        if r < 0.08:
            w += ","
        elif r < 0.11:
            w += ";"
        elif r < 0.13:
            w = "(" + w + ")"
        out.append(w)
    add("prose", " ".join(out) + rng.choice([".", "!", "?", "...", ""]))

# ---------------------------------------------------------------- code
add("code_python",
    "def add(a, b):\n    return a + b\n",
    "import os\nimport sys\n\n\nclass Foo(object):\n    \"\"\"Docstring.\"\"\"\n\n    def __init__(self, x: int = 0) -> None:\n        self.x = x\n\n    def __repr__(self):\n        return f\"Foo(x={self.x!r})\"\n",
    "for i in range(10):\n\tif i % 2 == 0:\n\t\tprint(i)\n\telse:\n\t\tcontinue\n",
    "x = [i**2 for i in range(100) if i % 3 == 0]\nprint(sum(x))",
    "    # leading indentation comment\n    pass",
    "if __name__ == \"__main__\":\n    main()\n",
    "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    raise ValueError(\"bad\") from e\nfinally:\n    cleanup()",
    "lambda x, *args, **kwargs: (x, args, kwargs)",
    "@decorator(arg=1)\nasync def fetch(url: str) -> bytes:\n        async with session.get(url) as r:\n                return await r.read()",
    "d = {'a': 1, \"b\": [1, 2, 3], 'c': {'nested': None}}\nprint(d['a'], d.get(\"z\", 0))",
    "s = '''triple\n  quoted\n\tstring'''\nr = r\"\\d+\\s*\\\\\"",
    "def f():\n  \t  mixed = True  # spaces, tab, spaces\n\t  \treturn mixed",
)
add("code_cpp",
    "#include <iostream>\n\nint main() {\n    std::cout << \"Hello, world!\" << std::endl;\n    return 0;\n}\n",
    "template <typename T>\nstruct Vec {\n\tT* data;\n\tsize_t n;\n\tT& operator[](size_t i) { return data[i]; }\n};",
    "for (int i = 0; i < n; ++i) {\n        a[i] += b[i] * c[i];\n}",
    "auto lambda = [&](const std::string& s) -> int { return static_cast<int>(s.size()); };",
    "#define MAX(a, b) ((a) > (b) ? (a) : (b))\n#ifdef __CUDA_ARCH__\n__global__ void k(float* __restrict__ x) { x[threadIdx.x] = 0.f; }\n#endif",
    "std::unordered_map<std::string, std::vector<std::pair<int, double>>> m;",
    "if(x){y();}else{z();}while(1);do{}while(0);",
    "namespace tandem::runtime {\n\nclass Tokenizer final {\n public:\n  explicit Tokenizer(std::string_view path);\n  ~Tokenizer() noexcept;\n\n private:\n  int n_ = 0;\n};\n\n}  // namespace tandem::runtime\n",
    "/* block\n * comment\n */\nint x = 0x7fffffff; unsigned long long y = 18446744073709551615ULL; float f = 1.5e-3f;",
    "ptr->field = *other_ptr; arr[i] >>= 2; a &&= b; c ||= d; e <=> f; g::h::i;",
)
add("code_json",
    "{\"name\": \"tandem\", \"version\": \"0.1.0\", \"private\": true}",
    "{\n  \"a\": 1,\n  \"b\": [1, 2, 3],\n  \"c\": {\"d\": null, \"e\": false}\n}",
    "[{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"hello\"}]",
    "{\n\t\"tabs\": \"indented\",\n\t\"nested\": {\n\t\t\"deep\": [\n\t\t\t1.5e10,\n\t\t\t-0.0\n\t\t]\n\t}\n}",
    "{\"escaped\": \"line\\nbreak \\\"quote\\\" \\\\ backslash \\u00e9 \\ud83d\\ude00\"}",
    "{\"model\":\"qwen3\",\"messages\":[{\"role\":\"system\",\"content\":\"You are helpful.\"}],\"temperature\":0.7,\"max_tokens\":256}",
    "[]",
    "{}",
    "[[[[[[[[[[1]]]]]]]]]]",
)
add("code_shell",
    "#!/usr/bin/env bash\nset -euo pipefail\n\nfor f in *.txt; do\n    echo \"$f\"\ndone\n",
    "ls -la /tmp | grep -v '^d' | awk '{print $9}' | sort -u > out.txt 2>&1",
    "export PATH=\"$HOME/.local/bin:$PATH\"; cd \"${WORKDIR:-/work}\" && make -j$(nproc)",
    "if [ -z \"$1\" ]; then\n\techo \"usage: $0 FILE\" >&2\n\texit 1\nfi",
    "curl -sSL -X POST -H 'Content-Type: application/json' -d '{\"prompt\": \"hi\"}' http://localhost:8000/v1/completions",
    "find . -name '*.cpp' -print0 | xargs -0 clang-format -i",
    "$ mpirun -np 4 ./tandem serve --model ~/models/qwen3 --port=8080 &\n[1] 12345",
    "git log --oneline --graph --decorate -n 20 -- src/",
)

# ---------------------------------------------------------------- CJK
add("cjk_zh",
    "\u4f60\u597d",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01",
    "\u6211\u7231\u5317\u4eac\u5929\u5b89\u95e8\u3002",
    "\u4eba\u5de5\u667a\u80fd\u662f\u8ba1\u7b97\u673a\u79d1\u5b66\u7684\u4e00\u4e2a\u5206\u652f\uff0c\u5b83\u4f01\u56fe\u4e86\u89e3\u667a\u80fd\u7684\u5b9e\u8d28\u3002",
    "\u5927\u8bed\u8a00\u6a21\u578b\uff08LLM\uff09\u7684\u63a8\u7406\u901f\u5ea6\u53d6\u51b3\u4e8e\u663e\u5b58\u5e26\u5bbd\u3002",
    "\u7e41\u9ad4\u4e2d\u6587\uff1a\u6211\u5011\u5728\u81fa\u7063\u5b78\u7fd2\u8cc7\u8a0a\u5de5\u7a0b\u3002",
    "\u4eca\u5929\u662f2024\u5e746\u670811\u65e5\uff0c\u6c14\u6e29\u662f25.5\u2103\u3002",
    "\u300a\u7ea2\u697c\u68a6\u300b\u662f\u4e2d\u56fd\u53e4\u5178\u5c0f\u8bf4\u3002\u201c\u4f60\u597d\u201d\uff0c\u4ed6\u8bf4\u3002",
    "\u4e2d\u6587 English \u6df7\u5408 mixed \u6587\u672c text",
    "\u4e00\u4e8c\u4e09\u56db\u4e94\u516d\u4e03\u516b\u4e5d\u5341\u767e\u5343\u4e07\u4ebf",
)
add("cjk_ja",
    "\u3053\u3093\u306b\u3061\u306f",
    "\u30b3\u30f3\u30cb\u30c1\u30cf",
    "\u3053\u3093\u306b\u3061\u306f\u3001\u4e16\u754c\uff01\u4eca\u65e5\u306f\u3044\u3044\u5929\u6c17\u3067\u3059\u306d\u3002",
    "\u79c1\u306f\u30b3\u30fc\u30d2\u30fc\u304c\u5927\u597d\u304d\u3067\u3059\u3002",
    "\u6771\u4eac\u30bf\u30ef\u30fc\u306f\u9ad8\u3055333\u30e1\u30fc\u30c8\u30eb\u3067\u3059\u3002",
    "\uff76\uff80\uff76\uff85 half-width katakana \uff8a\uff9d\uff76\uff78",
    "\u30a2\u30a4\u30a6\u30a8\u30aa \u304b\u304d\u304f\u3051\u3053 \u304c\u304e\u3050\u3052\u3054 \u3071\u3074\u3077\u307a\u307d",
    "\u300c\u5429\u8f29\u306f\u732b\u3067\u3042\u308b\u3002\u540d\u524d\u306f\u307e\u3060\u7121\u3044\u3002\u300d",
    "\u30ab\u3099 decomposed ga vs \u30ac precomposed ga",
    "\u30d7\u30ed\u30b0\u30e9\u30df\u30f3\u30b0\u8a00\u8a9e\u306ePython\u3068C++\u3092\u52c9\u5f37\u3057\u3066\u3044\u307e\u3059\u3002",
)
add("cjk_ko",
    "\uc548\ub155\ud558\uc138\uc694",
    "\uc548\ub155\ud558\uc138\uc694, \uc138\uacc4! \ubc18\uac11\uc2b5\ub2c8\ub2e4.",
    "\ub300\ud55c\ubbfc\uad6d\uc758 \uc218\ub3c4\ub294 \uc11c\uc6b8\uc785\ub2c8\ub2e4.",
    "\ud55c\uad6d\uc5b4 \ud615\ud0dc\uc18c \ubd84\uc11d\uc740 \uc5b4\ub835\uc2b5\ub2c8\ub2e4.",
    "\u1112\u1161\u11ab\u1100\u1173\u11af conjoining jamo (NFD Hangul)",
    "\ud55c\uae00 NFC vs \u1112\u1161\u11ab\u1100\u1173\u11af NFD",
    "\ud14d\uc2a4\ud2b8 123 \ubb38\uc7a5\uc785\ub2c8\ub2e4 \u3131\u3134\u3137\u314f\u3153",
    "\uc800\ub294 \ud559\uc0dd\uc785\ub2c8\ub2e4. \ub9cc\ub098\uc11c \ubc18\uac00\uc6cc\uc694!",
)

# ---------------------------------------------------------------- other scripts
add("arabic",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u0627\u0644\u0633\u0644\u0627\u0645 \u0639\u0644\u064a\u0643\u0645 \u0648\u0631\u062d\u0645\u0629 \u0627\u0644\u0644\u0647 \u0648\u0628\u0631\u0643\u0627\u062a\u0647",
    "\u0627\u0644\u0639\u064e\u0631\u064e\u0628\u0650\u064a\u064e\u0651\u0629\u064f \u0645\u0639 \u0627\u0644\u062a\u0634\u0643\u064a\u0644",
    "\u0627\u0644\u0631\u0642\u0645 \u0661\u0662\u0663\u0664\u0665 \u0648 12345",
    "Mixed \u0627\u0644\u0639\u0631\u0628\u064a\u0629 and English \u0641\u064a \u0633\u0637\u0631 \u0648\u0627\u062d\u062f.",
)
add("hebrew",
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "\u05d1\u05b0\u05bc\u05e8\u05b5\u05d0\u05e9\u05b4\u05c1\u05d9\u05ea \u05d1\u05b8\u05bc\u05e8\u05b8\u05d0 \u05d0\u05b1\u05dc\u05b9\u05d4\u05b4\u05d9\u05dd",
    "\u05d0\u05e0\u05d9 \u05d0\u05d5\u05d4\u05d1 \u05e7\u05e4\u05d4 (coffee) \u05d1\u05d1\u05d5\u05e7\u05e8.",
    "\u05de\u05d7\u05d9\u05e8: \u20aa99.90",
)
add("devanagari",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "\u0939\u093f\u0928\u094d\u0926\u0940 \u092d\u093e\u0930\u0924 \u0915\u0940 \u0930\u093e\u091c\u092d\u093e\u0937\u093e \u0939\u0948\u0964",
    "\u0915\u094d\u0937 \u0924\u094d\u0930 \u091c\u094d\u091e \u0936\u094d\u0930 \u0926\u094d\u0927 \u0939\u094d\u092e",
    "\u0938\u0902\u0916\u094d\u092f\u093e \u0967\u0968\u0969\u096a \u0914\u0930 1234",
    "\u0905\u0930\u094d\u0925\u0936\u093e\u0938\u094d\u0924\u094d\u0930 \u0914\u0930 \u0935\u093f\u091c\u094d\u091e\u093e\u0928 (science) \u0915\u0947 \u0932\u093f\u090f",
)
add("thai",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a",
    "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22\u0e44\u0e21\u0e48\u0e21\u0e35\u0e01\u0e32\u0e23\u0e40\u0e27\u0e49\u0e19\u0e27\u0e23\u0e23\u0e04\u0e23\u0e30\u0e2b\u0e27\u0e48\u0e32\u0e07\u0e04\u0e33",
    "\u0e01\u0e23\u0e38\u0e07\u0e40\u0e17\u0e1e\u0e21\u0e2b\u0e32\u0e19\u0e04\u0e23 \u0e51\u0e52\u0e53",
    "\u0e19\u0e49\u0e33\u0e41\u0e02\u0e47\u0e07 \u0e40\u0e1b\u0e47\u0e19 \u0e2a\u0e34\u0e48\u0e07\u0e17\u0e35\u0e48\u0e14\u0e35",
)
add("cyrillic",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!",
    "\u0421\u044a\u0435\u0448\u044c \u0436\u0435 \u0435\u0449\u0451 \u044d\u0442\u0438\u0445 \u043c\u044f\u0433\u043a\u0438\u0445 \u0444\u0440\u0430\u043d\u0446\u0443\u0437\u0441\u043a\u0438\u0445 \u0431\u0443\u043b\u043e\u043a, \u0434\u0430 \u0432\u044b\u043f\u0435\u0439 \u0447\u0430\u044e.",
    "\u041c\u041e\u0421\u041a\u0412\u0410 \u2014 \u0421\u0422\u041e\u041b\u0418\u0426\u0410 \u0420\u041e\u0421\u0421\u0418\u0418",
    "\u0423\u043a\u0440\u0430\u0457\u043d\u0441\u044c\u043a\u0430 \u043c\u043e\u0432\u0430: \u0457\u0436\u0430\u043a, \u0491\u0430\u043d\u043e\u043a, \u0454\u0434\u043d\u0456\u0441\u0442\u044c.",
    "\u0421\u0440\u043f\u0441\u043a\u0438: \u0452\u0430\u043a, \u045b\u0435\u0432\u0430\u043f, \u045f\u0435\u043f; \u0431\u044a\u043b\u0433\u0430\u0440\u0441\u043a\u0438 \u0435\u0437\u0438\u043a",
    "\u0439 vs \u0438\u0306 (decomposed short i)",
)
add("greek",
    "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5",
    "\u039e\u03b5\u03c3\u03ba\u03b5\u03c0\u03ac\u03b6\u03c9 \u03c4\u1f74\u03bd \u03c8\u03c5\u03c7\u03bf\u03c6\u03b8\u03cc\u03c1\u03b1 \u03b2\u03b4\u03b5\u03bb\u03c5\u03b3\u03bc\u03af\u03b1",
    "\u1f08\u03c1\u03c7\u1f74 \u1f26\u03bd \u1f41 \u03bb\u03cc\u03b3\u03bf\u03c2 (polytonic)",
    "\u03b1 + \u03b2 = \u03b3, \u03a3 \u03c3 \u03c2, \u03a9 \u2126 (ohm sign)",
    "\u039f\u0394\u03a5\u03a3\u03a3\u0395\u03a5\u03a3 \u03bf\u03b4\u03c5\u03c3\u03c3\u03b5\u03c5\u03c2",
)

# ---------------------------------------------------------------- emoji
add("emoji",
    "\U0001F600",
    "\U0001F600\U0001F603\U0001F604\U0001F601\U0001F606",
    "I love you \u2764\ufe0f",
    "\u2764",
    "\U0001F44D",
    "\U0001F44D\U0001F3FB \U0001F44D\U0001F3FC \U0001F44D\U0001F3FD \U0001F44D\U0001F3FE \U0001F44D\U0001F3FF",
    "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466",
    "\U0001F469\u200D\u2764\ufe0f\u200D\U0001F48B\u200D\U0001F468",
    "\U0001F468\U0001F3FD\u200D\U0001F4BB working",
    "\U0001F3F3\ufe0f\u200D\U0001F308 \U0001F3F4\u200D\u2620\ufe0f",
    "\U0001F1FA\U0001F1F8\U0001F1EC\U0001F1E7\U0001F1EF\U0001F1F5\U0001F1E9\U0001F1EA\U0001F1E8\U0001F1F3",
    "Flag: \U0001F1EB\U0001F1F7 France",
    "\U0001F3F4\U000E0067\U000E0062\U000E0065\U000E006E\U000E0067\U000E007F England",
    "1\ufe0f\u20e3 2\ufe0f\u20e3 #\ufe0f\u20e3 *\ufe0f\u20e3 0\u20e3",
    "Great job!!! \U0001F389\U0001F389\U0001F389 \U0001F680\U0001F525\U0001F4AF",
    "\U0001F9D1\u200D\U0001F91D\u200D\U0001F9D1 \U0001F9D1\U0001F3FF\u200D\U0001F91D\u200D\U0001F9D1\U0001F3FB",
    "\u263a \u263a\ufe0f \u263a\ufe0e (text vs emoji presentation)",
    "\U0001F926\U0001F3FC\u200D\u2642\ufe0f",
    "\U0001F431\U0001F436\U0001F42D\U0001F439\U0001F430\U0001F98A\U0001F43B\U0001F43C",
    "emoji\U0001F600in\U0001F600the\U0001F600middle",
    "\U0001F600 \U0001F600  \U0001F600   \U0001F600",
    "\U0001FAE0\U0001FAE1\U0001FAE8 (newer emoji)",
)

# ---------------------------------------------------------------- combining marks, NFC/NFD
nfc_nfd_src = [
    "caf\u00e9",
    "\u00c9cole \u00e9l\u00e9mentaire",
    "Ti\u1ebfng Vi\u1ec7t c\u00f3 nhi\u1ec1u d\u1ea5u",
    "\u00c5ngstr\u00f6m",
    "\u00f1and\u00fa pi\u00f1ata",
    "\ud55c\uad6d\uc5b4",
    "\u00e4\u00f6\u00fc\u00c4\u00d6\u00dc",
    "\u1e9b\u0323",
]
for s in nfc_nfd_src:
    nfc = unicodedata.normalize("NFC", s)
    nfd = unicodedata.normalize("NFD", s)
    add("nfc_nfd", nfc)
    if nfd != nfc:
        add("nfc_nfd", nfd)
add("combining",
    "e\u0301",
    "cafe\u0301",
    "e\u0301e\u0301e\u0301",
    "a\u0300\u0301\u0302\u0303\u0308",
    "Vi\u00ea\u0323t Nam",
    "Ng\u01b0\u1eddi Vi\u1ec7t Nam n\u00f3i ti\u1ebfng Vi\u1ec7t.",
    "To\u0302i yeu Vie\u0323\u0302t Nam",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034da\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354l\u0368\u0367\u0369\u0311\u0327\u0318\u0359\u0326g\u0311\u0357\u030e\u0305\u035b\u0341\u0334\u033b\u0348\u034d\u0354\u0339o\u0342\u030c\u030c\u0358\u0328\u0335\u0339\u033b\u031d\u0333",
    "x" + "\u0301" * 30,
    "\u0301 leading combining mark",
    "\u0301",
    "a\u0332b\u0332c\u0332 (underline)",
    "n\u0303 vs \u00f1",
    "\u0915\u093f \u0915\u0940 \u0915\u0941 (Devanagari vowel signs)",
    "\u1100\u1161\u11a8 jamo",
    "\u2126 vs \u03a9, \u212b vs \u00c5, \ufb01 ligature, \u2460 circled, \uff21 fullwidth",
)

# ---------------------------------------------------------------- whitespace
add("whitespace",
    " ",
    "  ",
    "   ",
    "    ",
    " " * 8,
    " " * 16,
    " " * 31,
    " " * 64,
    "\t",
    "\t\t\t",
    "\n",
    "\n\n",
    "\n\n\n\n\n",
    "\r\n",
    "\r",
    "\r\r\n\n",
    " \n \n ",
    "\t\n\t\n",
    "hello world   ",
    "hello world \n",
    "   hello world",
    "\n\nhello",
    "hello\n\n",
    "a  b   c    d     e",
    "a\tb\t\tc",
    "word \t \t word",
    "line one\r\nline two\r\nline three\r\n",
    "old mac\rline\rendings",
    "form\ffeed",
    "vertical\u000btab",
    "non\u00a0breaking\u00a0space",
    "\u00a0leading nbsp",
    "trailing nbsp\u00a0",
    "\u3000\u5168\u89d2\u7a7a\u683c\u3000ideographic\u3000space",
    "thin\u2009space and hair\u200aspace and en\u2002em\u2003",
    "narrow\u202fnbsp and figure\u2007space and medium\u205fmath",
    "line\u2028separator and paragraph\u2029separator",
    "next\u0085line (NEL)",
    "ogham\u1680space",
    "  \t \n\r\n \u00a0 \u3000 ",
    "x \n y \n\n z",
    "   \n   indented after newline",
    "end with spaces then newline   \n",
    "many newlines\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n",
    " " * 5 + "\t" + " " * 5 + "\n" + "\t" * 3,
    "\n ",
    " \n",
    "a \u00a0b",
    "a\u00a0 b",
    "  !",
    "1  2",
)

# ---------------------------------------------------------------- digits
for n in list(range(1, 21)) + [24, 25, 31, 32, 33, 39, 40]:
    digits = "".join(str((i * 7 + 3) % 10) for i in range(n))
    if n > 1 and digits[0] == "0":
        digits = "1" + digits[1:]
    add("digits", digits)
add("digits",
    "0",
    "00000",
    "0001",
    "1,000,000",
    "1.000.000,50",
    "1 000 000",
    "3.14159265358979323846264338327950288419",
    "-273.15",
    "+1 (555) 123-4567",
    "+44 20 7946 0958",
    "555-0199 ext. 42",
    "1e10 2.5E-3 6.022e23",
    "0x1F 0b1010 0o777 0xDEADBEEF",
    "v1.2.3 2024-06-11T12:34:56.789Z",
    "192.168.0.1 and ::1 and fe80::1%eth0",
    "$1,234.56 \u20ac99,99 \u00a3100 \u00a55000",
    "50% 99.9% 100%",
    "12:30 pm, 23:59:59",
    "The year 2000 had 12 months and 366 days.",
    "\u0661\u0662\u0663 \u0967\u0968\u0969 \uff11\uff12\uff13 \u2460\u2461\u2462 \u00b9\u00b2\u00b3 \u2153",
    "1st 2nd 3rd 4th 101st",
    "a1b2c3d4e5",
    "123abc456def",
    "9" * 12 + "." + "9" * 12,
)

# ---------------------------------------------------------------- contractions
add("contractions",
    "I'll",
    "I'm",
    "I'M",
    "don't",
    "DON'T",
    "Don't",
    "we've",
    "WE'VE",
    "they're",
    "THEY'RE",
    "they'Re",
    "it's",
    "IT'S",
    "It'S",
    "he'd",
    "HE'D",
    "she'll",
    "SHE'LL",
    "She'Ll",
    "can't won't shouldn't",
    "I\u2019m sure it\u2019s fine, don\u2019t worry, we\u2019ll see",
    "'s",
    "'S",
    "'ll",
    "'re 've 'm 'd 't",
    "''s",
    "'tis 'twas",
    "rock 'n' roll",
    "O'Reilly O'Neil",
    "the dogs' bones",
    "' s",
    "'",
    "'''",
    "x'sy",
    "'\u017f",
    "'\u0130",
    "'\u0131",
    "'\u212a",
    "it'\u017f fine",
    "I'\u0130ll",
)

# ---------------------------------------------------------------- case edge cases
add("case_edge",
    "\u017f",
    "\u0130stanbul \u0131s\u0131k",
    "I\u0307 (I + combining dot above)",
    "\u212a Kelvin vs K",
    "\u00df \u1e9e SS",
    "\ufb00 \ufb01 \ufb02 \ufb03 \ufb04",
    "\u01c4 \u01c5 \u01c6 (DZ digraphs)",
    "\u0130I\u0131i",
    "\u03a3\u03c3\u03c2 final sigma",
)

# ---------------------------------------------------------------- special tokens
add("special_qwen3",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "<|endoftext|><|endoftext|>",
    "text<|endoftext|>more text",
    "<think>\nLet me think.\n</think>\n\nThe answer is 4.",
    "<think></think>",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "<tool_response>\nsunny\n</tool_response>",
    "<|fim_prefix|>def f(<|fim_suffix|>):\n    pass<|fim_middle|>",
    "<|vision_start|><|image_pad|><|vision_end|>",
    "<|im_start|",
    "<|im_start>",
    "|im_start|>",
    "<|im_start| >",
    "<|IM_START|>",
    "<| im_start |>",
    "<|im_end|><|im_start|>",
    "<|im_start|><|im_start|>",
    "<<|im_start|>>",
    "<thinking>not a token</thinking>",
    "< think>",
    "<|endoftext|",
)
add("special_llama3",
    "<|begin_of_text|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_250|>",
    "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>",
    "<|begin_of_text",
    "<|eot_id",
    "<|eot_id|",
    "begin_of_text|>",
    "<|EOT_ID|>",
)
add("special_mistral",
    "<s>",
    "</s>",
    "<unk>",
    "<s>[INST] hi [/INST]",
    "<s>[INST] What is 2+2? [/INST] 4</s>[INST] And 3+3? [/INST]",
    "<s><s></s></s>",
    "< s>",
    "<s >",
    "</ s>",
    "<S>",
    "<unk",
    "unk>",
    "<s",
    "s>",
    "a<s>b</s>c",
    "<ss>",
    "<<s>>",
)
add("special_spaced",
    " <s> hi",
    "<s> hi",
    "hi </s> ",
    " </s>",
    "  <s>  ",
    "\n<s>\n",
    " <|im_start|> user",
    "<|im_end|> \n",
    " <|eot_id|>",
    "  <|begin_of_text|> hello",
    " <think> x </think> ",
    "\t<tool_call>\t",
)

# ---------------------------------------------------------------- URLs, emails, markdown, LaTeX
add("web_markup",
    "https://www.example.com/path/to/page?query=1&other=two#fragment",
    "http://localhost:8080/v1/chat/completions",
    "ftp://user:p%40ss@ftp.example.org:21/files/archive.tar.gz",
    "https://ja.wikipedia.org/wiki/\u6771\u4eac\u90fd",
    "https://en.wikipedia.org/wiki/Caf%C3%A9_au_lait",
    "Contact: john.doe+spam@example.co.uk, jane_doe@sub.domain.io",
    "<a href=\"https://example.com\">link</a><br/>&amp;&lt;&gt;&quot;&#39;&nbsp;",
    "# Heading 1\n\n## Heading 2\n\n- item one\n- item two\n  - nested\n\n1. first\n2. second\n",
    "**bold** *italic* ~~strike~~ `code` [link](https://x.y) ![img](a.png)",
    "```python\nprint('hi')\n```",
    "| col1 | col2 |\n|------|:----:|\n| a    | b    |",
    "> quote line\n> another\n\n---\n\n***",
    "$E = mc^2$ and $$\\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}$$",
    "\\begin{equation}\n  \\sum_{i=1}^{n} i = \\frac{n(n+1)}{2}\n\\end{equation}",
    "\\alpha\\beta\\gamma \\mathbb{R}^n \\left( \\frac{a}{b} \\right)",
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<root attr='v'><child/></root>",
    "@user #hashtag $TICKER r/subreddit u/someone",
    "<!-- comment --> <script>alert(1)</script>",
    "www.example.com example.com/a/b.html",
    "mailto:someone@example.com?subject=Hi%20there",
)

# ---------------------------------------------------------------- punctuation
add("punctuation",
    "!",
    "?!?!?!",
    "...",
    "......................................",
    "!@#$%^&*()_+-=[]{}|;':\",./<>?`~",
    "\\",
    "\\\\\\\\",
    "////",
    "---",
    "===",
    "***",
    "________________________________",
    "=-=-=-=-=-=-=-=-=-=-=-=-",
    "\u2014\u2013\u2012\u2010 \u2026 \u00ab\u00bb \u2039\u203a \u201e\u201c \u00bf\u00a1",
    "\u3002\u3001\uff01\uff1f\uff08\uff09\u300c\u300d\u3010\u3011",
    "()[]{}<>",
    "\"\"\"\"",
    "''''",
    "`~`~`",
    ",,, ;;; :::",
    "a.b,c;d:e!f?g",
    "!\n?\n.\n",
    ". . . . .",
    "\u00a7\u00b6\u2020\u2021\u2022\u2030\u2032\u2033",
    "\u2190\u2191\u2192\u2193\u21d2\u21d4\u2200\u2203\u2208\u2209\u2227\u2228\u00ac\u2260\u2264\u2265\u221e",
    "\u2500\u2502\u250c\u2510\u2514\u2518\u2588\u2591\u2592\u2593",
)

# ---------------------------------------------------------------- byte-ish escapes written as literal text
add("escape_text",
    "\\xff\\xfe",
    "\\x00\\x01\\x7f\\x80",
    "\\u0000",
    "\\u0000 null as text",
    "\\ud800\\udc00",
    "%E4%BD",
    "%E4%BD%A0%E5%A5%BD",
    "%00%FF%ZZ",
    "\\n\\t\\r (escaped, not real)",
    "&#0; &#xFFFE; &#128512;",
    "b'\\xe4\\xbd\\xa0'",
    "\\\\u005c",
    "0xFF 0xFE 0xEF 0xBB 0xBF",
)

# ---------------------------------------------------------------- control / format / invisible chars
add("controls",
    "\u0001",
    "a\u0001b",
    "\u0002\u0003\u0004\u0005\u0006\u0007\u0008",
    "\u001b[31mred\u001b[0m",
    "\u001b",
    "delete\u007f",
    "\u007f",
    "\u0080\u0081\u009f C1 controls",
    "\ufffd",
    "replacement \ufffd char",
    "\ufffd\ufffd\ufffd",
    "\ufeff",
    "\ufeffBOM at start",
    "BOM\ufeffin middle",
    "\u200b",
    "zero\u200bwidth\u200bspace",
    "\u200c",
    "\u200d",
    "ZWNJ\u200cZWJ\u200djoined",
    "\u200e\u200f",
    "\u202eright-to-left override\u202c",
    "\u2066isolate\u2069 \u061c arabic mark",
    "\u00ad soft\u00adhyphen",
    "\u2060word joiner\u2060",
    "\ue000",
    "\ue000\uf8ff private use",
    "\U000F0000\U0010FFFD supplementary private use",
    "\u001f\u001e\u001d\u001c separators",
    "bell\u0007 backspace\u0008",
    "\ufff9\ufffa\ufffb interlinear",
    "\uffff nonchar",
    "\ufdd0 nonchar",
    "\u034f combining grapheme joiner",
    "\u180e mongolian vowel separator",
)

# ---------------------------------------------------------------- astral plane
add("astral",
    "\U0001F600 grinning face",
    "\U00020000",
    "\U00020000\U00020001\U0002A6D6 CJK extension B",
    "\U0001D400\U0001D401\U0001D402 \U0001D49C\U0001D4B7 \U0001D538\U0001D539",
    "\U0001D7CE\U0001D7CF\U0001D7D0 math digits",
    "\U00010348 gothic hwair",
    "\U00013000\U00013001 egyptian hieroglyphs",
    "\U0001F0A1\U0001F0B1 playing cards",
    "\U0001F9E0\U0001F9EC",
    "\U00010000",
    "\U0010FFFD",
    "\U0001D11E musical G clef",
    "\U0001F680" * 20,
)

# ---------------------------------------------------------------- mixed / random
POOLS = [
    "abcdefghijklmnopqrstuvwxyz",
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "0123456789",
    " " * 6 + "\t\n",
    ".,;:!?'\"()-_/\\",
    "\u00e9\u00e8\u00ea\u00eb\u00e0\u00e7\u00f1\u00f6\u00fc\u00df",
    "\u4f60\u597d\u4e16\u754c\u5927\u8bed\u8a00\u6a21\u578b",
    "\u3042\u3044\u3046\u30a2\u30a4\u30a6",
    "\ud55c\uad6d\uc5b4",
    "\u0430\u0431\u0432\u0433\u0434\u0435\u0436\u0437",
    "\u03b1\u03b2\u03b3\u03b4",
    "\u0645\u0631\u062d\u0628\u0627",
    "\U0001F600\U0001F44D\u2764\ufe0f",
    "\u0301\u0308",
]
for i in range(30):
    n = rng.randint(1, 120)
    pools = rng.sample(POOLS, rng.randint(1, 4))
    s = "".join(rng.choice(rng.choice(pools)) for _ in range(n))
    add("random_mix", s)

# ---------------------------------------------------------------- long lines (~50 KB)
para = ("The tokenizer must be exact. Every byte of every prompt is mapped to the same ids as the reference, "
        "whether the text is prose, code, or numbers like 3.14159 and 2024; nothing may be dropped.\n")
add("long", (para * (50000 // len(para) + 1))[:50000])
add("long", "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(50000)))
add("long", "a" * 50000)
cjk_chars = "\u7684\u4e00\u662f\u4e0d\u4e86\u4eba\u6211\u5728\u6709\u4ed6\u8fd9\u4e2d\u5927\u6765\u4e0a\u56fd\u4e2a\u5230\u8bf4\u4eec\u4e3a\u5b50\u548c\u4f60\u5730\u51fa\u9053\u4e5f\u65f6\u5e74"
add("long", "".join(rng.choice(cjk_chars) for _ in range(16667)))  # 3 bytes each: ~50 KB
add("long", "".join(str(rng.randint(0, 9)) for _ in range(20000)))
add("long", " " * 10000)
add("long", ("def f(x):\n\treturn x  # comment\n" * 400))


# ---------------------------------------------------------------- output
def _needs_escape(ch):
    o = ord(ch)
    if o > 0xFFFF:
        return False
    if ch == " ":
        return False
    cat = unicodedata.category(ch)
    return cat in ("Cc", "Cf", "Zl", "Zp", "Zs", "Co", "Cs", "Cn") or o in (0xFFFD,)


def encode_line(s):
    raw = json.dumps(s, ensure_ascii=False)
    out = []
    for ch in raw:
        if _needs_escape(ch):
            out.append("\\u%04x" % ord(ch))
        else:
            out.append(ch)
    line = "".join(out)
    assert json.loads(line) == s
    assert "\n" not in line and "\r" not in line
    return line


def main():
    for cat, s in cases:
        assert "\x00" not in s, cat
        assert not any(0xD800 <= ord(c) <= 0xDFFF for c in s), cat
    with open(OUT, "w", encoding="utf-8", newline="\n") as f:
        for _, s in cases:
            f.write(encode_line(s) + "\n")
    if "--stats" in sys.argv:
        counts = {}
        for cat, _ in cases:
            counts[cat] = counts.get(cat, 0) + 1
        for cat, n in counts.items():
            print("%-16s %d" % (cat, n))
        print("%-16s %d" % ("TOTAL", len(cases)))
        print("bytes (UTF-8 of the strings): %d" % sum(len(s.encode("utf-8")) for _, s in cases))


if __name__ == "__main__":
    main()
