// Validates an AsyncAPI document against the AsyncAPI JSON Schema of its version.
// Usage: node validate-asyncapi.mjs FILE   (exit 0: valid; 1: the errors, as JSON)
import { readFileSync } from "node:fs";
import Ajv from "ajv";
import addFormats from "ajv-formats";
import specs from "@asyncapi/specs";

const doc = JSON.parse(readFileSync(process.argv[2], "utf8"));
const schema = specs.schemas[doc.asyncapi];
if (!schema) {
  console.log(JSON.stringify({ valid: false, errors: [`no schema for asyncapi ${doc.asyncapi}`] }));
  process.exit(1);
}
const ajv = new Ajv({ allErrors: true, strict: false, meta: false, validateSchema: false });
addFormats(ajv);
const valid = ajv.validate(schema, doc);
console.log(JSON.stringify({ valid, errors: valid ? [] : ajv.errors.slice(0, 10) }));
process.exit(valid ? 0 : 1);
