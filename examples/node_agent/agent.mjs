// An agent on the cardbus bus in Node, on the `nats` client from npm only, written
// against the published wire format (docs/reference/wire.md, `cardbus schema`).
//
//   npm install            (once: brings `nats`)
//   node agent.mjs --nats nats://127.0.0.1:4222 --agent shout
//
// It binds the durable pull consumer agent-<agent> of CARDBUS_INBOX, answers each card
// with a result card on cardbus.reply.<agent>.<task>[.<partition>] and then acks it,
// answers a redelivered card (same task_id and attempt) with the same result, rejects a
// card for a capability it does not offer, and announces itself on
// cardbus.announce.<agent> every third of its lease (online: false when it stops).
//
// Capability "text.shout": {"text": string} -> {"text": the text in upper case + "!"}.

import { createHash } from "node:crypto";
import { hostname } from "node:os";
import { randomBytes } from "node:crypto";
import { AckPolicy, DeliverPolicy, connect, headers } from "nats";

const WIRE_VERSION = 1;
const INBOX_STREAM = "CARDBUS_INBOX";
const REPLY_STREAM = "CARDBUS_REPLIES";
const TEXT = { type: "object", properties: { text: { type: "string" } }, required: ["text"] };
const CAPABILITIES = [
  { name: "text.shout", description: "the text shouted", input_schema: TEXT, output_schema: TEXT },
];

function option(name, fallback) {
  const at = process.argv.indexOf(`--${name}`);
  return at >= 0 && at + 1 < process.argv.length ? process.argv[at + 1] : fallback;
}

// An id as one subject token (the wire's rule): A-Z a-z 0-9 - as they are, every other
// byte of its UTF-8 form "_" and two hex digits; the empty id "_".
function token(value) {
  if (!value) return "_";
  let out = "";
  for (const byte of Buffer.from(value, "utf8")) {
    const ch = String.fromCharCode(byte);
    out += /[A-Za-z0-9-]/.test(ch) ? ch : `_${byte.toString(16).padStart(2, "0")}`;
  }
  return out;
}

const url = option("nats", "nats://127.0.0.1:4222");
const agentId = option("agent", "shout");
const leaseS = Number(option("lease", "3"));
const t = token(agentId);
const replicaId = `${hostname()}-${process.pid}-${randomBytes(3).toString("hex")}`;
const encoder = new TextEncoder();
const decoder = new TextDecoder();
const answers = new Map(); // "<task_id>/<attempt>" -> the result sent
let renewal = 0;
let stopping = false;

function announcement(online) {
  renewal += 1;
  const card = {
    agent_id: agentId,
    name: "Shout (Node)",
    description: "a Node agent: no cardbus inside",
    version: "1.0.0",
    capabilities: CAPABILITIES,
    provider: "examples/node_agent",
  };
  const message = {
    type: "announce",
    card,
    online,
    lease_s: leaseS,
    replica_id: replicaId,
    renewal,
    wire_version: WIRE_VERSION,
  };
  return encoder.encode(JSON.stringify(message));
}

function answer(card) {
  const result = {
    type: "result_card",
    task_id: card.task_id,
    attempt: card.attempt ?? 1,
    agent_id: agentId,
    replica_id: replicaId,
    host: hostname(),
    pid: process.pid,
  };
  if (card.capability !== "text.shout") {
    const notes = `${agentId} does not offer ${JSON.stringify(card.capability)}`;
    return { ...result, status: "rejected", reason: "out_of_capability", notes };
  }
  const text = (card.inputs ?? {}).text;
  if (typeof text !== "string") {
    const notes = "inputs.text must be a string";
    return { ...result, status: "rejected", reason: "input_schema_mismatch", notes };
  }
  return { ...result, status: "completed", output: { text: `${text.toUpperCase()}!` } };
}

async function main() {
  const nc = await connect({
    servers: url,
    user: option("user", undefined),
    pass: option("password", undefined),
    inboxPrefix: `_INBOX.${t}`, // the only replies its user may subscribe to
    name: `node-${agentId}`,
    maxReconnectAttempts: -1,
  });
  // no $JS.API.INFO: an agent's user may only look up the cardbus streams
  const jsm = await nc.jetstreamManager({ checkAPI: false });
  const js = nc.jetstream({ checkAPI: false });
  console.log(`connected to ${url}; waiting for the cardbus streams`);
  for (;;) {
    try {
      await jsm.streams.info(INBOX_STREAM);
      await jsm.streams.info(REPLY_STREAM);
      break;
    } catch {
      await new Promise((done) => setTimeout(done, 200));
    }
  }
  const durable = `agent-${t}`;
  try {
    await jsm.consumers.info(INBOX_STREAM, durable);
  } catch {
    try {
      await jsm.consumers.add(INBOX_STREAM, {
        name: durable,
        durable_name: durable,
        filter_subject: `cardbus.agent.${t}`,
        deliver_policy: DeliverPolicy.All,
        ack_policy: AckPolicy.Explicit,
        ack_wait: 30_000_000_000, // nanoseconds
        max_deliver: 5,
        backoff: [30, 60, 120, 240].map((s) => s * 1_000_000_000),
        max_ack_pending: 10_000,
        max_waiting: 4096,
      });
    } catch (e) {
      console.log(`consumer ${durable} made meanwhile: ${e.message}`);
    }
  }
  const inbox = await js.consumers.get(INBOX_STREAM, durable);
  await js.publish(`cardbus.announce.${t}`, announcement(true));
  console.log(`node agent ${agentId} serving on ${url}`);
  const renewing = setInterval(() => {
    js.publish(`cardbus.announce.${t}`, announcement(true)).catch(() => {});
  }, (leaseS * 1000) / 3);

  const stop = async () => {
    if (stopping) return;
    stopping = true;
    clearInterval(renewing);
    try {
      await js.publish(`cardbus.announce.${t}`, announcement(false));
    } catch {}
    await nc.drain();
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);

  while (!stopping) {
    let msg;
    try {
      msg = await inbox.next({ expires: 1000 });
    } catch (e) {
      if (stopping) break;
      await new Promise((done) => setTimeout(done, 200));
      continue;
    }
    if (msg) await handle(js, msg);
  }
}

async function handle(js, msg) {
  let card;
  try {
    card = JSON.parse(decoder.decode(msg.data));
    if (typeof card.task_id !== "string") throw new Error("no task_id");
  } catch (e) {
    // not a card: dead-letter it, and never again
    const h = headers();
    h.set("Cardbus-Reason", `not a task card: ${e.message}`);
    h.set("Cardbus-Subject", msg.subject);
    await js.publish("cardbus.dead.agent", msg.data, { headers: h });
    msg.term();
    return;
  }
  const key = `${card.task_id}/${card.attempt ?? 1}`;
  if (!answers.has(key)) answers.set(key, answer(card)); // a redelivery: the same answer
  const result = { ...answers.get(key), delivery: msg.info.deliveryCount };
  let subject = `cardbus.reply.${t}.${token(card.task_id)}`;
  const partition = msg.headers?.get("Cardbus-Partition");
  if (partition && /^[0-9]+$/.test(partition)) subject += `.${partition}`;
  const data = encoder.encode(JSON.stringify(result));
  const msgID = createHash("sha256").update(data).digest("hex").slice(0, 32);
  const h = headers();
  const trace = msg.headers?.get("traceparent");
  if (trace) h.set("traceparent", trace);
  await js.publish(subject, data, { msgID, headers: h });
  msg.ack(); // answered: the card is done
}

main().catch((e) => {
  console.error(`node agent failed: ${e.stack ?? e}`);
  process.exit(1);
});
