#!/usr/bin/env python3
"""`tandem run` with structured outputs (issue 35): JSON schemas, json_object,
regex, choice and grammars on batch lines, chat and completions.
  - Every schema output that stops on its own validates under ajv (with
    ajv-formats), a validator we did not write; regex outputs match the
    pattern (Python's re), choices are one of the choices; with sampling at
    temperature 1 most stop on their own.
  - Token ids are the same bits in one process, aggregated over 2 workers,
    disaggregated 1P+1D (the first token is drawn on the prefill rank, under
    the grammar) and in a tensor-parallel worker of 2.
  - A stop string ends the output only where the text before it is complete.
  - A schema keyword that is not enforced is that line's error record, naming
    it; the other lines go on.
  - A random model with the real Qwen3 vocabulary (151k tokens): outputs
    validate too.
  - Tools on the same model (Qwen3's chat template and call format), and on
    random models with Llama 3.2's and Mistral-Nemo's templates: calls
    under tool_choice required / named / parallel_tool_calls false are calls
    only, their arguments valid under ajv; none holds no call; the same token
    ids in one process, disaggregated and tensor-parallel.
Usage: structured_run_test.py TANDEM SRC_DIR"""
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from testlib import Checks, make_model, mpi_env, run_job  # noqa: E402

tandem, src = sys.argv[1], Path(sys.argv[2]).resolve()
env = mpi_env()
check = Checks()
modules = src / "node_deps/node_modules"

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"},
                                      "n": {"anyOf": [{"type": "integer", "minimum": -5, "maximum": 5}, {"type": "null"}]}},
     "required": ["color", "ok", "n"]},
    {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 6}, "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"when": {"type": "string", "format": "date"},
                                      "id": {"type": "string", "format": "uuid"},
                                      "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"}},
     "required": ["when", "id", "code"]},
    {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                                                         "kids": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                                                  "maxItems": 2}},
                        "required": ["v"]}}, "$ref": "#/$defs/node"},
]
REGEXES = [r"\d{3}-\d{4}", r"(yes|no), because [a-z ]{3,12}\.", r"[A-Z][a-z]{1,8}( [A-Z][a-z]{1,8}){0,2}"]
CHOICES = [["red", "green", "blue"], ["positive", "negative", "neutral"]]


def lines():
    out, expect = [], {}
    k = 0
    for rep in range(3):
        for i, schema in enumerate(SCHEMAS):
            cid = f"schema{i}-{rep}"
            body = {"max_tokens": 200, "temperature": 1.0, "seed": 10 * rep + i}
            if (i + rep) % 2:
                body.update(logprobs=True, top_logprobs=1)
                body["messages"] = [{"role": "user", "content": f"Give me item {k} as JSON."}]
                body["response_format"] = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema,
                                                                                  "strict": True}}
                url = "/v1/chat/completions"
            else:
                body["logprobs"] = 1
                body["prompt"] = f"Item {k} as JSON:"
                body["structured_outputs"] = {"json": schema}
                url = "/v1/completions"
            out.append({"custom_id": cid, "method": "POST", "url": url, "body": body})
            expect[cid] = ("schema", schema)
            k += 1
    for i, rx in enumerate(REGEXES):
        for rep in range(2):
            cid = f"regex{i}-{rep}"
            out.append({"custom_id": cid, "prompt": f"Answer {k}:", "max_tokens": 40, "temperature": 1.0 if rep else 0,
                        "seed": k, "structured_outputs": {"regex": rx}})
            expect[cid] = ("regex", rx)
            k += 1
    for i, ch in enumerate(CHOICES):
        cid = f"choice{i}"
        out.append({"custom_id": cid, "prompt": f"Pick {k}:", "max_tokens": 8, "temperature": 1.0, "seed": k,
                    "guided_choice": ch})
        expect[cid] = ("choice", ch)
        k += 1
    # A stop string inside the output: cut only where the text before it is complete.
    out.append({"custom_id": "stop", "prompt": "List:", "max_tokens": 40, "temperature": 1.0, "seed": 5,
                "stop": [";"], "structured_outputs": {"regex": "[a-z]{2,4}(;[a-z]{2,4}){0,3}!"}})
    expect["stop"] = ("stop", None)
    out.append({"custom_id": "object", "prompt": "JSON:", "max_tokens": 60, "temperature": 1.0, "seed": 9,
                "response_format": {"type": "json_object"}})
    expect["object"] = ("object", None)
    # Refused, one error record each; the job goes on.
    out.append({"custom_id": "bad-keyword", "prompt": "x", "response_format": {"type": "json_schema", "json_schema": {
        "name": "b", "schema": {"type": "array", "uniqueItems": True}}}})
    out.append({"custom_id": "bad-regex", "prompt": "x", "structured_outputs": {"regex": "(?=x)x"}})
    return out, expect


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                     "unit": {"enum": ["celsius", "fahrenheit"]},
                                     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "unit"]}}}
LOOKUP = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"ids": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
                                             "maxItems": 3}}, "required": ["ids"]}}}
PING = {"type": "function", "function": {"name": "ping"}}
TOOL_SCHEMAS = {t["function"]["name"]: t["function"].get("parameters", {"type": "object", "additionalProperties": False})
                for t in (WEATHER, LOOKUP, PING)}


def tool_lines(family):
    """Chat lines with tools under every tool_choice, for a model of `family` (qwen3: thinking switched off;
    llama: Meta's 3.1 template, one call per answer, a date given); (custom_id -> kind)."""
    out, kinds = [], {}
    kwargs = {"qwen3": {"enable_thinking": False}, "llama": {"date_string": "05 Dec 2026"}}.get(family)
    choices = [("required", "required", {}), ("required1", "required", {"parallel_tool_calls": False}),
               ("named", {"type": "function", "function": {"name": "lookup"}}, {}), ("auto", "auto", {}),
               ("none", "none", {"max_tokens": 24})]
    for rep in range(3):
        for kind, choice, extra in choices:
            cid = f"tool-{kind}-{rep}"
            body = {"messages": [{"role": "user", "content": f"Question {rep}: the weather in Oslo?"}],
                    "tools": [WEATHER, LOOKUP, PING], "tool_choice": choice, "max_tokens": 160, "temperature": 1.0,
                    "seed": 100 + rep, **({"chat_template_kwargs": kwargs} if kwargs else {}), **extra}
            out.append({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body})
            kinds[cid] = kind
    if family == "qwen3":
        # With thinking on, a required call may come after a <think> block (a random model rarely closes one).
        out.append({"custom_id": "tool-think", "messages": [{"role": "user", "content": "Ping it."}], "tools": [PING],
                    "tool_choice": "required", "max_tokens": 40, "temperature": 1.0, "seed": 7})
        kinds["tool-think"] = "think"
    # A conversation that carries earlier calls and their results (Mistral's template wants 9-character ids).
    call_id = "a1B2c3D4e" if family == "mistral" else "call_1"
    out.append({"custom_id": "tool-history", "messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "5 C"}], "tools": [WEATHER], "max_tokens": 40, "seed": 8})
    kinds["tool-history"] = "auto"
    # Refused, one error record each.
    out.append({"custom_id": "tool-bad-keyword", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required",
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
                    "x": {"type": "string", "format": "hostname"}}}}}]})
    out.append({"custom_id": "tool-completion", "prompt": "x", "tools": [PING]})
    kinds["tool-bad-keyword"] = kinds["tool-completion"] = "bad"
    return out, kinds


def judge_tools(got, kinds, family):
    items, where, wrong, stopped = [], [], [], {}
    for cid, kind in kinds.items():
        o = got.get(cid)
        if kind == "bad" or o is None or o.get("error"):
            continue
        c = o["response"]["body"]["choices"][0]
        calls = c["message"].get("tool_calls") or []
        if family == "mistral" and any(len(t["id"]) != 9 or not t["id"].isalnum() for t in calls):
            wrong.append(f"{cid}: Mistral's ids are 9 letters and digits: {calls}")
        if kind in ("required", "required1", "named") and c["finish_reason"] != "length":
            stopped[kind] = stopped.get(kind, 0) + 1
            if c["finish_reason"] != "tool_calls" or not calls or c["message"]["content"] is not None:
                wrong.append(f"{cid}: not calls only: {c}")
        if (kind == "required1" or family == "llama") and len(calls) > 1:
            wrong.append(f"{cid}: {len(calls)} calls with parallel_tool_calls false")
        if kind == "named" and any(t["function"]["name"] != "lookup" for t in calls):
            wrong.append(f"{cid}: another function than the named one: {calls}")
        if kind == "none" and (calls or "<tool_call>" in (c["message"]["content"] or "") or
                               (c["message"]["content"] or "").startswith('{"name": "')):
            wrong.append(f"{cid}: a call under tool_choice none: {c}")
        if calls and c["finish_reason"] not in ("tool_calls", "length"):
            wrong.append(f"{cid}: calls with finish_reason {c['finish_reason']}")
        for t in calls:
            if (family != "mistral" and not t["id"].startswith("call_")) or t["type"] != "function":
                wrong.append(f"{cid}: {t}")
            items.append({"schema": TOOL_SCHEMAS.get(t["function"]["name"], False), "text": t["function"]["arguments"]})
            where.append(cid)
    verdicts = validate(items) if items else []
    bad = [f"{c}: {v['why']}: {i['text']}" for c, v, i in zip(where, verdicts, items) if not v["valid"]]
    check(f"tools {family}: every call's arguments validate under ajv against its function's parameters "
          f"({len(items)} calls)", not bad and len(items) >= 8, "; ".join(bad)[:600])
    check(f"tools {family}: required and named answers are calls only (most stop on their own), none answers hold "
          "no call", not wrong and sum(stopped.values()) >= 6, "; ".join(wrong)[:800] + f" stopped {stopped}")
    errs = {c: got[c]["error"]["message"] for c in ("tool-bad-keyword", "tool-completion") if got.get(c, {}).get("error")}
    check(f"tools {family}: an unenforced parameter keyword and tools on a completion are error records naming them",
          "hostname" in errs.get("tool-bad-keyword", "") and "function 'f'" in errs.get("tool-bad-keyword", "")
          and "tools are for chat completions" in errs.get("tool-completion", ""), str(errs)[:400])


def validate(items):
    p = subprocess.run(["node", str(src / "tests/mpi/validate_json.cjs"), str(modules)], input=json.dumps(items),
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(p.stderr)
    return json.loads(p.stdout)


with tempfile.TemporaryDirectory() as d:
    tmp = Path(d)
    rows, expect = lines()
    (tmp / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def run(model, name, np, *sets, timeout=300):
        p, records, _ = run_job(tandem, env, tmp / "in.jsonl", tmp / f"{name}.jsonl", model, np, *sets, timeout=timeout)
        return p, records

    def text_of(o):
        c = o["response"]["body"]["choices"][0]
        return (c["message"]["content"] if "message" in c else c["text"]), c["finish_reason"]

    def judge(name, got):
        items, where = [], []
        failed = [c for c, (k, _) in expect.items() if k != "bad" and (c not in got or got[c].get("error"))]
        check(f"{name}: every structured line is answered", not failed,
              "; ".join(f"{c}: {got.get(c, {}).get('error')}" for c in failed)[:400])
        for cid, (kind, arg) in expect.items():
            o = got.get(cid)
            if o is None or o.get("error"):
                continue
            text, reason = text_of(o)
            if kind == "schema" and reason == "stop":
                items.append({"schema": arg, "text": text})
                where.append(cid)
        verdicts = validate(items) if items else []
        bad = [f"{c}: {v['why']}: {got[c]['response']['body']['choices'][0]}" for c, v in zip(where, verdicts) if not v["valid"]]
        schema_lines = [c for c, (k, _) in expect.items() if k == "schema"]
        check(f"{name}: every schema output that stopped validates under ajv ({len(items)} of {len(schema_lines)} stopped)",
              not bad and len(items) >= 0.7 * len(schema_lines), "; ".join(bad)[:600])
        wrong = []
        for cid, (kind, arg) in expect.items():
            o = got.get(cid)
            if o is None or o.get("error"):
                continue
            text, reason = text_of(o)
            if kind == "regex" and reason == "stop" and not re.fullmatch(arg, text):
                wrong.append(f"{cid}: {text!r} !~ {arg}")
            if kind == "choice" and text not in arg:
                wrong.append(f"{cid}: {text!r} not in {arg}")
            if kind == "object" and reason == "stop":
                try:
                    if not isinstance(json.loads(text), dict):
                        wrong.append(f"{cid}: not an object: {text!r}")
                except ValueError as e:
                    wrong.append(f"{cid}: {e}: {text!r}")
            if kind == "stop" and not re.fullmatch(r"[a-z]{2,4}(;[a-z]{2,4}){0,3}!|[a-z]{2,4}(;[a-z]{2,4}){0,3}", text):
                wrong.append(f"stop: {text!r}")
        check(f"{name}: regex outputs match, choices are choices, json_object parses, stop strings cut complete text",
              not wrong, "; ".join(wrong)[:600])
        errs = {c: got[c]["error"]["message"] for c in ("bad-keyword", "bad-regex") if c in got and got[c].get("error")}
        check(f"{name}: unsupported keywords and regexes are error records naming them",
              "'uniqueItems' is not supported" in errs.get("bad-keyword", "") and
              "lookaround" in errs.get("bad-regex", "") and len(got) == len(expect) + 2, str(errs)[:300])

    demo = src / "demo/model"
    ref = None
    if check.wants("demo"):
        p, ref = run(demo, "single", 1)
        check("demo model, one process: every line answered", p.returncode == 0 and len(ref) == len(rows),
              f"rc {p.returncode}, {len(ref)} of {len(rows)}")
        judge("demo single", ref)
        sample = ref.get("schema0-0")
        if sample and not sample.get("error"):
            c = sample["response"]["body"]["choices"][0]
            check("logprobs come with structured outputs", c.get("logprobs") is not None, str(c)[:200])
        ids = lambda got: {c: o["tandem"]["token_ids"] for c, o in got.items() if not o.get("error")}
        for name, np, sets in (("agg 2 workers", 3, ['job.mode="agg"']),
                               ("disagg 1P+1D", 3, ['job.mode="disagg"', "router.local_prefill_tokens=1"]),
                               ("agg tp=2", 3, ['job.mode="agg"', "cluster.tp=2"])):
            p, got = run(demo, name.replace(" ", "_"), np, *sets)
            diff = [c for c in ids(ref) if ids(got).get(c) != ids(ref)[c]]
            check(f"demo model, {name}: the same token ids as one process", p.returncode == 0 and ref and not diff
                  and len(got) == len(ref), f"rc {p.returncode}, differ: {diff[:5]}")
    if check.wants("qwen3 vocabulary"):
        model = make_model(tandem, src, tmp / "tiny", "tiny", 3, "qwen3", "--dtype", "f32")
        p, got = run(model, "qwen3", 1, timeout=600)
        check("random model, Qwen3's vocabulary: every line answered", p.returncode == 0 and len(got) == len(rows),
              f"rc {p.returncode}")
        judge("random model, Qwen3's vocabulary", got)

    # Tool calls on random models with real tokenizers and chat templates: Qwen3's (<tool_call> blocks),
    # Llama 3.2's (Meta's 3.1 template: the answer is one {"name", "parameters"} object) and Mistral-Nemo's
    # (the special token [TOOL_CALLS], then a list of calls).
    for family, tokenizer, widths in (("qwen3", "qwen3", ("one process", "disagg 1P+1D", "agg tp=2")),
                                      ("llama", "llama3_2", ("one process", "disagg 1P+1D")),
                                      ("mistral", "mistral_nemo", ("one process", "disagg 1P+1D"))):
        if not check.wants(f"tools {family}"):
            continue
        model = tmp / "tiny" if family == "qwen3" else tmp / f"tiny-{family}"
        if not model.exists():
            model = make_model(tandem, src, model, "tiny", 3, "qwen3", "--dtype", "f32", tokenizer=tokenizer)
        rows, kinds = tool_lines(family)
        (tmp / f"tools-{family}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs = {}
        for name, np, sets in (("one process", 1, []), ("disagg 1P+1D", 3, ['job.mode="disagg"', "router.local_prefill_tokens=1"]),
                               ("agg tp=2", 3, ['job.mode="agg"', "cluster.tp=2"])):
            if name not in widths:
                continue
            p, got, _ = run_job(tandem, env, tmp / f"tools-{family}.jsonl", tmp / f"tools-{family}-{name.replace(' ', '_')}.jsonl",
                                model, np, *sets, timeout=300)
            check(f"tools {family}, {name}: every line answered", p.returncode == 0 and len(got) == len(rows),
                  f"rc {p.returncode}")
            runs[name] = got
        ref = runs["one process"]
        judge_tools(ref, kinds, family)
        ids = lambda got: {c: o["tandem"]["token_ids"] for c, o in got.items() if not o.get("error")}
        for name, got in runs.items():
            diff = [c for c in ids(ref) if ids(got).get(c) != ids(ref)[c]]
            check(f"tools {family}, {name}: the same token ids as one process", ref and not diff, f"differ: {diff[:5]}")

sys.exit(check.exit_code())
