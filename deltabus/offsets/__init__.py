"""Consumer groups and their committed offsets, on the group coordinator's side.

Runs in the Spark driver: `GroupCoordinator` (membership, rebalances, generations) and
`OffsetStore` (the `__consumer_offsets` Delta table). The consumer's side of the protocol
(assignors, subscription and assignment bytes) is in `deltabus.client`.

May import: the pure modules and `log_tables`; never grpc (tests/test_layering.py).
"""
