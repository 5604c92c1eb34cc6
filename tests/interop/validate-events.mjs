// Validates events with the exported JSON Schemas, as a subscriber in another language
// would: each stdin line is one of subscribe.mjs's ({type, schema, event}); the schema is
// the type's at the major `schema` names (`Bc-Schema`: `N` or `N.M`).
// Usage: node validate-events.mjs SCHEMA_DIR < lines   (one {seq, type, valid, errors} a line)
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";

const ajv = new Ajv2020({ allErrors: true, strict: false });
addFormats(ajv);
const validators = new Map();
function validatorFor(type, schemaHeader) {
  const key = `${type}.v${String(schemaHeader || "1").split(".")[0]}`;
  if (!validators.has(key)) {
    const schema = JSON.parse(readFileSync(`${process.argv[2]}/${key}.json`, "utf8"));
    validators.set(key, ajv.compile(schema));
  }
  return validators.get(key);
}

for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  const { seq, type, schema, event } = JSON.parse(line);
  const validate = validatorFor(type, schema);
  const valid = validate(event);
  console.log(JSON.stringify({ seq, type, valid, errors: valid ? [] : validate.errors }));
}
