// The users' notes' KafkaJS consumer (consumer.ts: group "my-app3", subscribe fromBeginning),
// unchanged but for the broker address (KAFKA_BROKERS, comma-separated, default the notes'
// localhost:9092), the topic and group from argv, and that it stops after COUNT messages.
//
//   KAFKA_BROKERS=127.0.0.1:9092 node consumer.js TOPIC GROUP COUNT [TIMEOUT_MS]
//
// Prints each message as a JSON line {topic, partition, offset, key, value} (offset a number,
// key null when absent); once COUNT arrived it commits the next offset of every partition it
// read, disconnects (leaving the group) and exits 0. Exits 1 if COUNT did not arrive within
// TIMEOUT_MS (default 30000). KafkaJS's own log lines go to the same stdout as JSON with
// "logger":"kafkajs".
// TLS and SASL, where a test asks for them, come from KAFKA_SECURITY_PROTOCOL and the other
// variables security.js reads.
const { Kafka } = require("kafkajs");
const { securityFromEnv } = require("./security");

const [topic, groupId, countArg, timeoutArg] = process.argv.slice(2);
const count = Number(countArg);
const timeoutMs = Number(timeoutArg || 30000);
if (!topic || !groupId || !(count > 0)) {
  console.error("usage: node consumer.js TOPIC GROUP COUNT [TIMEOUT_MS]");
  process.exit(2);
}

const kafka = new Kafka({
  clientId: "my-app",
  brokers: (process.env.KAFKA_BROKERS || "localhost:9092").split(","),
  ...securityFromEnv(),
});

const consumer = kafka.consumer({ groupId });

async function main() {
  let received = 0;
  const next = new Map(); // partition -> next offset to read
  let done;
  const enough = new Promise((resolve) => (done = resolve));
  const timer = setTimeout(() => done(false), timeoutMs);

  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  await consumer.run({
    eachMessage: async ({ topic, partition, message }) => {
      if (received >= count) {
        return;
      }
      received += 1;
      next.set(partition, Number(message.offset) + 1);
      console.log(JSON.stringify({
        topic,
        partition,
        offset: Number(message.offset),
        key: message.key === null ? null : message.key.toString(),
        value: message.value === null ? null : message.value.toString(),
      }));
      if (received === count) {
        done(true);
      }
    },
  });

  const ok = await enough;
  clearTimeout(timer);
  if (ok) {
    await consumer.commitOffsets([...next].map(([partition, offset]) => (
      { topic, partition, offset: String(offset) })));
  } else {
    console.error(`only ${received} of ${count} messages within ${timeoutMs} ms`);
  }
  await consumer.disconnect();
  process.exit(ok ? 0 : 1);
}

main().catch(async (error) => {
  console.error(error);
  await consumer.disconnect().catch(() => {});
  process.exit(1);
});
