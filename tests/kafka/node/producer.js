// The users' notes' KafkaJS producer (producer-user.ts: keyed messages to "payment-done"), unchanged
// but for the broker address, read from KAFKA_BROKERS (comma-separated; the notes' default
// localhost:9092 is where `make run` puts deltabus's Kafka listener).
//
//   KAFKA_BROKERS=127.0.0.1:9092 node producer.js TOPIC KEY:VALUE [KEY:VALUE ...]
//
// Sends the messages, in order, in one producer.send() and prints what KafkaJS returns, one
// RecordMetadata per partition written, as JSON lines:
//   {"topicName":"t","partition":0,"errorCode":0,"baseOffset":"0",...}
// KafkaJS's own log lines go to the same stdout as JSON with "logger":"kafkajs".
// TLS and SASL, where a test asks for them, come from KAFKA_SECURITY_PROTOCOL and the other
// variables security.js reads.
const { Kafka } = require("kafkajs");
const { securityFromEnv } = require("./security");

const [topic, ...pairs] = process.argv.slice(2);
if (!topic || pairs.length === 0) {
  console.error("usage: node producer.js TOPIC KEY:VALUE [KEY:VALUE ...]");
  process.exit(2);
}
const messages = pairs.map((pair) => {
  const sep = pair.indexOf(":");
  return sep < 0 ? { value: pair } : { value: pair.slice(sep + 1), key: pair.slice(0, sep) };
});

const kafka = new Kafka({
  clientId: "my-app",
  brokers: (process.env.KAFKA_BROKERS || "localhost:9092").split(","),
  ...securityFromEnv(),
});

const producer = kafka.producer();

async function main() {
  await producer.connect();
  try {
    const metadata = await producer.send({ topic, messages });
    for (const m of metadata) {
      console.log(JSON.stringify(m));
    }
  } finally {
    await producer.disconnect();
  }
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
