#!/usr/bin/env python3
"""Regenerates tests/data/py_json_cases.json: JSON texts and what Python's
json.dumps(value, ensure_ascii=False) writes for them, compact and with
indent=4 -- the `tojson` filter of Hugging Face's chat templates, which
runtime/tokenizer/py_json.h reproduces. Not run by the tests (they read the
committed file). Usage: python3 tests/data/make_py_json_cases.py"""
import json
from pathlib import Path

TEXTS = [
    '{"a": 1, "b": [1.5, 2.0, 1e-05, 1e16, 1e15, 0.0001, 123456789.125, -0.0, 1e-320, 3.14159e200, 0.1, 100.0, 1E5]}',
    '{"c": "tab\\there \\"q\\" \\\\ \\u0001 \\u007f \\u00fc \\ud83d\\ude00 / \\b\\f\\r\\n"}',
    '{"d": null, "e": true, "x": false, "f": {}, "g": [], "h": {"z": 1, "a": {"n": [[], {}]}}}',
    '{"i": 18446744073709551615, "j": -9223372036854775808, "k": 0, "l": -7}',
    '[1, "two", [3.0], {"four": 4}]',
    '"just a string"',
    '{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": '
    '{"city": {"type": "string", "description": "City, e.g. \\"Z\\u00fcrich\\""}, "days": {"type": "integer", '
    '"minimum": 1, "maximum": 7, "default": 1.0}}, "required": ["city"]}}}',
]

cases = []
for text in TEXTS:
    value = json.loads(text)
    cases.append({"text": text, "compact": json.dumps(value, ensure_ascii=False),
                  "indent4": json.dumps(value, ensure_ascii=False, indent=4)})
out = Path(__file__).resolve().parent / "py_json_cases.json"
out.write_text(json.dumps(cases, indent=2, ensure_ascii=True) + "\n")
print(f"wrote {out}: {len(cases)} cases")
