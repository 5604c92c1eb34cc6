// Session events from a stream sequence on, as the `subscriber` principal (nats.js 3).
// It creates no consumer: it reads BC_EVENTS message by message and is woken by the
// events' own subjects. Prints one JSON line per event; resume with START_SEQ = seq + 1.
// NATS_URL, NKEY_SEED_FILE (subscriber.nk), START_SEQ (none: from the next event),
// COUNT (stop after that many; none: never).
import { readFileSync } from "node:fs";
import { connect, nkeyAuthenticator, nkeys } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";

const env = process.env;
const seed = new TextEncoder().encode(readFileSync(env.NKEY_SEED_FILE, "utf8").trim());
const publicKey = nkeys.fromSeed(seed).getPublicKey(); // "U…", as in auth.conf
const nc = await connect({
  servers: env.NATS_URL,
  authenticator: nkeyAuthenticator(seed),
  inboxPrefix: `_INBOX.${publicKey}`, // its only reply subjects: _INBOX.<its key>.>
});
const jsm = await jetstreamManager(nc); // $JS.API.INFO
const stream = "BC_EVENTS";
const wanted = "bc.events.>"; // or one kind: "bc.events.node.>"

let wake = () => {};
nc.subscribe(wanted, { callback: () => wake() }); // told of a new event; read it from the stream
const { state } = await jsm.streams.info(stream); // $JS.API.STREAM.INFO.BC_EVENTS
let seq = env.START_SEQ ? Number(env.START_SEQ) : state.last_seq + 1;
if (seq < state.first_seq) {
  console.error(`events ${seq} to ${state.first_seq - 1} are past the stream's retention`);
}
let seen = 0;
while (!env.COUNT || seen < Number(env.COUNT)) {
  // $JS.API.STREAM.MSG.GET.BC_EVENTS {"seq": seq, "next_by_subj": wanted}
  const m = await jsm.streams.getMessage(stream, { seq, next_by_subj: wanted });
  if (m === null) { // none yet: wait for a publish (or look again in a second)
    await new Promise((resolve) => { wake = resolve; setTimeout(resolve, 1000); });
    continue;
  }
  const line = { seq: m.seq, msgId: m.header.get("Nats-Msg-Id"), time: m.time.toISOString(),
    type: m.header.get("Bc-Type"), schema: m.header.get("Bc-Schema"), subject: m.subject,
    event: m.json() };
  console.log(JSON.stringify(line)); // handle it, then keep m.seq: resume from m.seq + 1
  seq = m.seq + 1;
  seen += 1;
}
await nc.close();
