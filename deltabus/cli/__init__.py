"""The `deltabus` command: one subcommand per Kafka tool in `bin/` (kafka-topics,
kafka-console-producer, kafka-consumer-groups, ...) with Kafka's flag names and columns, plus
`cluster start`. Runs in the user's shell; may import any other package.
"""
