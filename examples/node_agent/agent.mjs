// An agent on the cardbus bus in Node, on the `nats` client from npm only, written
// against the published wire format (docs/reference/wire.md, `cardbus schema`).
//
//   npm install            (once: brings `nats`)
//   node agent.mjs --nats nats://127.0.0.1:4222 --agent shout [--llm URL --model NAME]
//
// It binds the durable pull consumer agent-<agent> of CARDBUS_INBOX, takes one card at a
// time from it, answers each with a result card on cardbus.reply.<agent>.<task>
// [.<partition>] and then acks it, answers a redelivered card (same task_id and attempt)
// with the same result, rejects a card for a capability it does not offer, and announces
// itself on cardbus.announce.<agent> every third of its lease (online: false when it
// stops).
//
// Capability "text.shout": {"text": string} -> {"text": the text in upper case + "!"}.
// With --llm URL (an OpenAI-compatible endpoint) also "text.ask": {"question": string}
// -> {"answer": string}, one model call journaled as the wire says: a model.request on
// cardbus.req.<agent> before it (answered with a recorded answer: no call is made), a
// model.answer after it, and the answer used only once that is answered (durable).

import { createHash, randomBytes } from "node:crypto";
import { hostname } from "node:os";
import { AckPolicy, DeliverPolicy, connect, headers } from "nats";

const WIRE_VERSION = 1;
const INBOX_STREAM = "CARDBUS_INBOX";
const REPLY_STREAM = "CARDBUS_REPLIES";
const TEXT = { type: "object", properties: { text: { type: "string" } }, required: ["text"] };
const SHOUT = {
  name: "text.shout",
  description: "the text shouted",
  input_schema: TEXT,
  output_schema: TEXT,
};
const ASK = {
  name: "text.ask",
  description: "a question answered by a model",
  input_schema: {
    type: "object",
    properties: { question: { type: "string" } },
    required: ["question"],
  },
  output_schema: { type: "object", properties: { answer: { type: "string" } } },
};

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
const llm = option("llm", undefined); // an OpenAI-compatible base URL: text.ask too
const model = option("model", "stub-model");
const t = token(agentId);
const replicaId = `${hostname()}-${process.pid}-${randomBytes(3).toString("hex")}`;
const encoder = new TextEncoder();
const decoder = new TextDecoder();
const answers = new Map(); // "<task_id>/<attempt>" -> the result sent
let renewal = 0;
let stopping = false;
let nc; // the connection
let cards; // the inbox's messages, one pulled at a time

function announcement(online) {
  renewal += 1;
  const card = {
    agent_id: agentId,
    name: "Shout (Node)",
    description: "a Node agent: no cardbus inside",
    version: "1.0.0",
    capabilities: llm ? [SHOUT, ASK] : [SHOUT],
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

async function answer(card) {
  const result = {
    type: "result_card",
    task_id: card.task_id,
    attempt: card.attempt ?? 1,
    agent_id: agentId,
    replica_id: replicaId,
    host: hostname(),
    pid: process.pid,
  };
  if (card.capability === "text.ask" && llm) {
    const question = (card.inputs ?? {}).question;
    if (typeof question !== "string") {
      const notes = "inputs.question must be a string";
      return { ...result, status: "rejected", reason: "input_schema_mismatch", notes };
    }
    let said;
    try {
      said = await askModel(card, question);
    } catch (e) {
      // the model or the journal failed: a failed result, with why
      return { ...result, status: "failed", error: `${e.name}: ${e.message}` };
    }
    const usage = {
      input_tokens: said.input_tokens ?? 0,
      output_tokens: said.output_tokens ?? 0,
      model: said.model ?? "",
    };
    return { ...result, status: "completed", output: { answer: said.text }, usage };
  }
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

// One agent_request on cardbus.req.<agent>: its result (ok: false, or the header
// Cardbus-Error when the orchestrator failed, throws).
async function request(card, kind, args, execution, seq) {
  const message = {
    type: "agent_request",
    request_id: randomBytes(16).toString("hex"),
    task_id: card.task_id,
    root_id: card.root_id ?? "",
    attempt: card.attempt ?? 1,
    agent_id: agentId,
    kind,
    target: model,
    args,
    traceparent: card.traceparent ?? null,
    execution,
    seq,
  };
  const msg = await nc.request(`cardbus.req.${t}`, encoder.encode(JSON.stringify(message)), {
    timeout: 10_000,
  });
  const failure = msg.headers?.get("Cardbus-Error");
  if (failure) throw new Error(`${kind}: the orchestrator failed: ${failure}`);
  const reply = JSON.parse(decoder.decode(msg.data));
  if (!reply.ok) throw new Error(`${kind}: ${reply.error_type}: ${reply.error}`);
  return reply.result;
}

// One model call, journaled: the recorded answer when the orchestrator has one for this
// place (a retry asking the same thing), else a live call whose answer is recorded
// before it is used.
async function askModel(card, question) {
  const execution = randomBytes(16).toString("hex"); // a new one at every delivery
  const seq = 0; // the call's place in this execution
  const call = { model, messages: [{ role: "user", content: question }] };
  const digest = createHash("sha256").update(JSON.stringify(call)).digest("hex");
  const asked = await request(card, "model.request", { request: call, digest }, execution, seq);
  if (asked?.replay) return asked.replay; // asked before, at this place: no call
  const start = performance.now();
  let said;
  try {
    said = await chat(call);
  } catch (e) {
    const error = `${e.name}: ${e.message}`;
    const failed = { call: asked?.call ?? "", error, error_type: "llm_error" };
    await request(card, "model.answer", failed, execution, seq);
    throw e;
  }
  const latency_s = (performance.now() - start) / 1000;
  const answered = { call: asked?.call ?? "", answer: said, latency_s };
  await request(card, "model.answer", answered, execution, seq); // durable: now use it
  return said;
}

// The OpenAI-compatible call; its answer as the journal records it.
async function chat(call) {
  const response = await fetch(`${llm.replace(/\/+$/, "")}/chat/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: "Bearer none" },
    body: JSON.stringify(call),
    signal: AbortSignal.timeout(30_000),
  });
  if (!response.ok) throw new Error(`HTTP ${response.status} from ${llm}`);
  const body = await response.json();
  return {
    text: body.choices[0].message.content ?? "",
    model: body.model ?? model,
    input_tokens: body.usage?.prompt_tokens ?? 0,
    output_tokens: body.usage?.completion_tokens ?? 0,
  };
}

async function main() {
  nc = await connect({
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
  while (!stopping) {
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

  const stop = () => {
    stopping = true;
    cards?.close(); // no more pulls: the loop below ends after the card in hand
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);

  // One card at a time. consume() keeps one subscription for every pull, so a card the
  // server sends just before a pull expires is still taken when it arrives late (next()
  // forgets its pull at its own expiry and drops such a card: it would come back only
  // after the ack wait). The next pull goes out once the loop body is done.
  while (!stopping) {
    try {
      cards = await inbox.consume({ max_messages: 1, expires: 30_000 });
      if (stopping) cards.close();
      for await (const msg of cards) {
        try {
          await handle(js, msg);
        } catch (e) {
          // e.g. a reply the server refused: give the card back, to try again in a second
          console.log(`cannot answer ${msg.subject}: ${e.message}`);
          msg.nak(1000);
        }
      }
    } catch (e) {
      if (!stopping) console.log(`pulling cards failed (${e.message}); again`);
    }
    if (!stopping) await new Promise((done) => setTimeout(done, 200));
  }
  clearInterval(renewing);
  try {
    await js.publish(`cardbus.announce.${t}`, announcement(false));
  } catch {}
  await nc.drain();
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
  if (!answers.has(key)) answers.set(key, await answer(card)); // a redelivery: the same answer
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
