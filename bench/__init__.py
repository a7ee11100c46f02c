"""deltabus's benchmarks (`make bench`, `python -m bench`): throughput and latency against the
project's targets.

A development tool beside `tests/`, not part of the installed package: setup.cfg packages
`deltabus` only. It may import anything of deltabus; deltabus never imports it
(tests/test_layering.py checks both directions it can see).

    run.py            the order of the steps, the embedded cluster, results.json
    sizes.py          every knob of a run (records, rounds, seconds), checked in one place
    produce_fetch.py  (a)-(g): straight write, bulk and per-record produce, fetch, latency
    groups.py         (h) offset commits at scale, (i) rebalance time
    stream_drain.py   (j) a Structured Streaming query against Spark's own Parquet reader
    small_files.py    (k) a partition table after many small commits, before and after merge
    kafka_clients.py  (l) Kafka's perf-test workload through confluent-kafka beside gRPC
    object_storage.py (r) produce, fetch and latency with the root on S3, requests per MB
    moto_server.py    moto's S3 server on loopback and its access log (the tests use it too)
    report.py         the targets, PASS/MISS, the table printed at the end
"""
