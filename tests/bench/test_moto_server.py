"""bench/moto_server.py counts the requests moto's S3 server served, by method and key, from
its access log: checked on a few requests made by hand with boto3, whose count is known (no
Spark); and its conditional puts are atomic, as S3's are."""

from __future__ import annotations

import pathlib
import threading
from concurrent.futures import ThreadPoolExecutor

from bench.moto_server import by_method, log_mark, s3_server, served
from deltabus.storage import Storage


def test_requests_are_counted_by_method_between_marks(tmp_path: pathlib.Path) -> None:
    log = tmp_path / "moto.log"
    with s3_server(log) as server:
        s3 = server.client()
        server.create_bucket("counted")  # one PUT, before the mark
        start = log_mark(log)
        for i in range(3):
            s3.put_object(Bucket="counted", Key=f"t/{i}", Body=b"x" * 10)
        s3.get_object(Bucket="counted", Key="t/0")
        s3.get_object(Bucket="counted", Key="t/1", Range="bytes=0-3")
        s3.head_object(Bucket="counted", Key="t/2")
        s3.list_objects_v2(Bucket="counted", Prefix="t/")
        s3.list_objects(Bucket="counted")  # v1: GET /counted
        s3.delete_object(Bucket="counted", Key="t/0")
        s3.delete_objects(Bucket="counted", Delete={"Objects": [{"Key": "t/1"}]})
        middle = log_mark(log)
        try:
            s3.get_object(Bucket="counted", Key="missing")
        except Exception as missing:  # 404: a coloured log line, counted all the same
            assert "NoSuchKey" in str(missing)
        end = log_mark(log)
    assert by_method(served(log, start, middle)) == {
        "PUT": 3, "GET": 2, "HEAD": 1, "LIST": 2, "DELETE": 1, "POST": 1}
    assert served(log, middle, end) == [("GET", "missing")]
    everything = served(log)  # the bucket's creation too, not moto's own API
    assert len(everything) == 1 + 10 + 1 and everything[0] == ("PUT", "")
    assert by_method(everything, "t/") == {  # those naming a key (or listing a prefix) of t/
        "PUT": 3, "GET": 2, "HEAD": 1, "LIST": 1, "DELETE": 1, "POST": 0}


def test_racing_creates_of_one_key_let_exactly_one_win() -> None:
    """S3's conditional put (`If-None-Match: *`, Storage.put_if_absent) lets exactly one of
    racing writers create a key: the Delta commit writer's versions depend on it. moto's own
    server checked and then put with no lock between, and two writers got one version."""
    rounds, writers = 100, 6  # moto's race showed in 2 rounds of 300 on a loaded machine
    with s3_server() as server:
        root = server.create_bucket("races")
        storage = Storage(root, server.options())
        for round_ in range(rounds):
            barrier = threading.Barrier(writers)

            def create(n: int, key: str = f"{root}/v/{round_:05d}.json",
                       barrier: threading.Barrier = barrier) -> bool:
                barrier.wait()
                return storage.put_if_absent(key, f"writer {n}".encode())

            with ThreadPoolExecutor(writers) as pool:
                won = [n for n, ok in enumerate(pool.map(create, range(writers))) if ok]
            assert len(won) == 1, (round_, won)
            assert storage.read_bytes(f"{root}/v/{round_:05d}.json") == f"writer {won[0]}".encode()
