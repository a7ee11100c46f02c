"""Consumer groups and their committed offsets, on the group coordinator's side.

Runs in the Spark driver, split as Kafka's group coordinator: `GroupCoordinator` (the front the
doors call) routes to `GroupMetadataManager` (membership: `ClassicGroup`, KIP-848's
`ConsumerGroup`) and `OffsetMetadataManager` (commits, fetches, deletes, expiry), over
`OffsetStore` (the `__consumer_offsets` Delta table). The consumer's side of the protocol
(assignors, subscription and assignment bytes) is in `deltabus.client`.

May import: the pure modules and `log_tables`; never grpc (tests/test_layering.py).
"""
