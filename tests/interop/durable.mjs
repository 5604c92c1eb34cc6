// Session events from the durable `sub-<app>` that `bcw provision` made, as the
// `subscriber-<app>` principal (nats.js 3): the server keeps its place; an event is
// acked once handled, and one not acked is delivered again (after its ack wait).
// NATS_URL, NKEY_SEED_FILE (subscriber-<app>.nk), APP, COUNT (stop after that many).
import { readFileSync } from "node:fs";
import { connect, nkeyAuthenticator, nkeys } from "@nats-io/transport-node";
import { jetstream } from "@nats-io/jetstream";

const env = process.env;
const seed = new TextEncoder().encode(readFileSync(env.NKEY_SEED_FILE, "utf8").trim());
const nc = await connect({
  servers: env.NATS_URL,
  authenticator: nkeyAuthenticator(seed),
  inboxPrefix: `_INBOX.${nkeys.fromSeed(seed).getPublicKey()}`,
});
// binds the existing consumer ($JS.API.CONSUMER.INFO.BC_EVENTS.sub-<app>): never creates one
const consumer = await jetstream(nc).consumers.get("BC_EVENTS", `sub-${env.APP}`);
let seen = 0;
while (!env.COUNT || seen < Number(env.COUNT)) {
  // one at a time ($JS.API.CONSUMER.MSG.NEXT.BC_EVENTS.sub-<app>): `consume()` is faster,
  // but what it holds in hand when the process stops comes again only after the ack wait
  const m = await consumer.next({ expires: 30_000 });
  if (m === null) continue; // none within 30 s: ask again
  const line = { seq: m.seq, msgId: m.headers?.get("Nats-Msg-Id"), redelivered: m.redelivered,
    type: m.headers?.get("Bc-Type"), schema: m.headers?.get("Bc-Schema"), subject: m.subject,
    event: m.json() };
  console.log(JSON.stringify(line)); // handle it, then ack: $JS.ACK.BC_EVENTS.sub-<app>.…
  await m.ackAck(); // the server has the ack: a restart resumes after it
  seen += 1;
}
await nc.close();
