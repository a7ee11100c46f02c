// KafkaJS's `ssl` and `sasl` options from Kafka's client configs, given as environment variables
// (none set: PLAINTEXT, as the notes' scripts connect):
//
//   KAFKA_SECURITY_PROTOCOL  PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL (security.protocol)
//   KAFKA_SSL_CA_LOCATION    PEM file of the CA that signed the brokers' certificates
//   KAFKA_SASL_MECHANISM     PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (sasl.mechanism)
//   KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD
//
// Passwords come from the environment, never argv, so `ps` does not show them.
const fs = require("fs");

const PROTOCOLS = ["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"];

function securityFromEnv(env = process.env) {
  const protocol = (env.KAFKA_SECURITY_PROTOCOL || "PLAINTEXT").toUpperCase();
  if (!PROTOCOLS.includes(protocol)) {
    throw new Error(`KAFKA_SECURITY_PROTOCOL must be one of ${PROTOCOLS.join(", ")}`);
  }
  const options = {};
  if (protocol === "SSL" || protocol === "SASL_SSL") {
    options.ssl = env.KAFKA_SSL_CA_LOCATION
      ? { ca: [fs.readFileSync(env.KAFKA_SSL_CA_LOCATION, "utf-8")] }
      : true;
  }
  if (protocol.startsWith("SASL_")) {
    options.sasl = {
      mechanism: (env.KAFKA_SASL_MECHANISM || "PLAIN").toLowerCase(),
      username: env.KAFKA_SASL_USERNAME || "",
      password: env.KAFKA_SASL_PASSWORD || "",
    };
  }
  return options;
}

module.exports = { securityFromEnv };
