#!/usr/bin/env node
// Outputs against their JSON schemas by ajv (with ajv-formats), a validator
// we did not write. stdin: [{"schema": {...}, "text": "..."}]; stdout: one
// {"valid": bool, "why": "..."} per item, in order.
// Usage: validate_json.cjs NODE_MODULES_DIR < items.json
"use strict";
const path = require("path");
const modules = process.argv[2];
const Ajv = require(path.join(modules, "ajv")).default;
const addFormats = require(path.join(modules, "ajv-formats")).default;
const items = JSON.parse(require("fs").readFileSync(0, "utf8"));
const out = items.map(({ schema, text }) => {
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    return { valid: false, why: `not JSON: ${e.message}` };
  }
  const ajv = new Ajv({ strict: false, allErrors: true });
  addFormats(ajv);
  const validate = ajv.compile(schema);
  return validate(value) ? { valid: true, why: "" } : { valid: false, why: ajv.errorsText(validate.errors) };
});
process.stdout.write(JSON.stringify(out));
