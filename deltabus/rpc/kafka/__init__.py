"""Kafka's wire protocol: a second front door onto the same brokers, partitions, groups and
offsets as the gRPC API, so Kafka's own clients and tools work unchanged.

- `frames`: request and response frames, with kio's schemas for every API and version.
- `batches`: record batches (magic v2, any compression codec) to and from partition log rows.
- `apis`: what each Kafka API does, in terms of the broker's (or controller's) handler.
- `listener`: the TCP listener each broker (and the bootstrap) runs.
"""
