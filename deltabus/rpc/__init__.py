"""The doors: how requests reach the domain, and how servers reach each other.

- gRPC: `v1/deltabus.proto` (the public API) and `v1/internal.proto` (broker registration and
  follower fetches), with their generated code; `server` and `group_servicer` (public),
  `internal_servicer` (internal), `codec` (protobuf <-> domain types), `status` (deltabus errors
  <-> gRPC statuses), `channel` (how channels are opened).
- Kafka's protocol: `kafka/`, the listener Kafka's own clients use.
- A broker's calls out: `controller_channel` (to the controller), `leader_endpoint` (to the
  leaders it follows), both in domain types.

Servers run wherever the controller (driver) or a broker (executor) runs. Servicers stay thin:
decode, call the domain object, encode. May import the pure modules, `log_tables`, `offsets` and
`cluster.handler`; `v1`, `codec`, `status` and `channel` import only pure modules, so the clients
can use them (tests/test_layering.py).
"""
