// JSON text as the models' Jinja chat templates write it: their `tojson`
// filter is Python's json.dumps(value, ensure_ascii=False) in Hugging Face's
// transformers (and vLLM, SGLang), so a tool's schema reaches the model with
// ", " and ": " between items, non-ASCII characters as they are, floats as
// Python's repr prints them, and keys in the order the request gave them.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace tandem::runtime {

// json.dumps(value, ensure_ascii=False) when indent < 0; with indent >= 0,
// json.dumps(value, ensure_ascii=False, indent=indent) (items end with ","
// and a new line, nested levels indented by `indent` more spaces).
std::string py_json_dumps(const nlohmann::ordered_json& value, int indent = -1);

}  // namespace tandem::runtime
