// A subscriber as a team outside would write it: NATS.js, an ordered consumer on the
// events stream, each event validated with the exported JSON Schema its headers name.
// Usage: node subscribe.mjs NATS_URL STREAM SCHEMA_DIR COUNT
// Prints one JSON line per event: {type, valid, errors}; exits after COUNT events.
import { readFileSync } from "node:fs";
import { connect } from "nats";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";

const [url, stream, schemaDir, count] = process.argv.slice(2);
const ajv = new Ajv2020({ allErrors: true, strict: false });
addFormats(ajv);
const validators = new Map();
function validatorFor(type, schemaHeader) {
  const major = String(schemaHeader || "1").split(".")[0];
  const key = `${type}.v${major}`;
  if (!validators.has(key)) {
    const schema = JSON.parse(readFileSync(`${schemaDir}/${key}.json`, "utf8"));
    validators.set(key, ajv.compile(schema));
  }
  return validators.get(key);
}

const nc = await connect({ servers: url });
const consumer = await nc.jetstream().consumers.get(stream);
const messages = await consumer.consume();
console.log(JSON.stringify({ ready: true }));
let seen = 0;
for await (const m of messages) {
  const type = m.headers?.get("Bc-Type");
  const validate = validatorFor(type, m.headers?.get("Bc-Schema"));
  const valid = validate(m.json());
  console.log(JSON.stringify({ type, valid, errors: valid ? [] : validate.errors }));
  if (++seen >= Number(count)) break;
}
await nc.close();
