"""The cluster: who leads what, and the processes that serve it.

Runs in the Spark driver: `Controller` (the lock, the metadata log and the commit path) with its
handlers (`replication_control`, `config_control`, `broker_registry`, `producer_id_control`:
request in, metadata records and answer out) and the state they replay into (`metadata_records`,
`metadata_state`), and `Cluster` (starts the controller, the broker jobs and the log cleaner).
Runs on executors, as long-lived Spark tasks: `Broker` (a partition leader or follower),
`Partition`, `ReplicaFetcher`. `handler` holds the contracts the doors call (`DeltaBusHandler`,
`FetchSpec`, `FetchResult`).

May import: the pure modules, `log_tables`, `offsets`, `spark` (Cluster registers the data
source) and the doors in `rpc` (servers, `ControllerChannel`, `RemoteLeaderEndpoint`), which
speak gRPC so this package never does: no grpc or protobuf import here (tests/test_layering.py).
"""
