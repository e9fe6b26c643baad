// JSON Schema -> EBNF, for `response_format` json_schema and json_object and
// `structured_outputs.json`. The output is compact JSON: no whitespace
// between tokens (so a model cannot loop on spaces), properties in the order
// the schema lists them.
//
// The subset (docs/structured-outputs.md says the same to users):
//   type (one or a list), properties, required, additionalProperties (bool or
//   schema; absent = false, as xgrammar's strict mode and OpenAI's strict
//   schemas), items (schema or false), prefixItems, minItems, maxItems, enum,
//   const, anyOf, oneOf (as anyOf: a value matching two branches is not
//   refused), allOf (of object schemas: properties and required merged),
//   local $ref (#, #/$defs/..., #/definitions/..., recursive too), $defs and
//   definitions, minLength, maxLength, pattern (regex.h's subset, matched
//   whole), format (date, time, date-time, uuid, email), integer minimum,
//   maximum, exclusiveMinimum, exclusiveMaximum. Annotations (title,
//   description, default, examples, $schema, $id, $comment, deprecated,
//   readOnly, writeOnly) constrain nothing and are read past.
// Any other keyword throws tandem::Error naming it and where it is, e.g.
// "JSON schema at /properties/age: 'multipleOf' is not supported; ...".
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

namespace tandem::grammar {

struct JsonSchemaLimits {
  std::size_t max_rules = 10'000;  // one per subschema, roughly
  int max_depth = 64;              // nesting of subschemas (not of recursive $ref use)
};

// EBNF text whose `root` matches exactly the compact JSON texts valid under
// `schema` (within the subset above).
std::string json_schema_to_ebnf(const nlohmann::ordered_json& schema, const JsonSchemaLimits& limits = {});

// The same rules for a grammar that holds several schemas (a tool call's
// arguments, one schema per function): the value is the rule `name`, the
// other rules' names begin with `name_`, and the json_* rules they call are
// json_basics_ebnf(), to be added once to the whole grammar.
std::string json_schema_rules(const nlohmann::ordered_json& schema, const std::string& name,
                              const JsonSchemaLimits& limits = {});
std::string json_basics_ebnf();

// Any JSON object ({"type": "json_object"}): compact, nested to any depth.
std::string json_object_ebnf();

}  // namespace tandem::grammar
