"""Every code example of README.md and docs/ runs (tests/docs/examples.py says how): the quick
starts and the pages' examples cannot rot. Each page's examples run against the session's
shared cluster (with a schema registry served for it, and its addresses in place of `make
run`'s), in a folder of their own; what they create there (topics, groups, ACLs, quotas, users,
schemas, views) is removed after each page, so pages and the rest of the suite do not meet.

The first tests need no Spark: they read the pages, so a block that could not run is found at
once, and they hold the count of examples that run, so this test cannot pass by running none.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from tests.docs.examples import (
    ADDRESSES,
    PAGES,
    RUN,
    SHOWN,
    Block,
    Deltabus,
    Prints,
    Unsupported,
    WriteFile,
    blocks,
    commands,
    expected_prints,
    localized,
    python_source,
    run_bash,
)

EXAMPLES = [block for page in PAGES for block in blocks(page)]
# The examples that run, and those marked notest (a cluster on other machines, a bucket,
# certificates, a cluster started from the shell): a page whose blocks stopped being found, or
# were marked notest to make a failure go away, fails here instead of passing silently. Change
# the bounds on purpose, in the commit that adds or marks the examples.
RUNNING_MIN = 29
MARKED_MAX = 15


def test_every_block_runs_or_says_why_not() -> None:
    for block in EXAMPLES:
        assert block.language in RUN + SHOWN, f"{block.where}: language {block.language!r}"
        if block.notest is not None:
            assert block.language in RUN, f"{block.where}: only python and bash blocks run"
            assert len(block.notest) > 10, f"{block.where}: say why it cannot run"


def test_enough_examples_run_and_most_of_them() -> None:
    running = [b for b in EXAMPLES if b.runs]
    marked = [b for b in EXAMPLES if b.language in RUN and not b.runs]
    assert len(running) >= RUNNING_MIN, [b.where for b in running]
    assert len(marked) <= MARKED_MAX, [b.where for b in marked]
    assert {b.page.name for b in running} >= {
        "README.md", "grpc-api.md", "kafka-compatibility.md", "spark-and-sql.md",
        "schema-registry.md", "security.md", "operations.md", "delivery-guarantees.md"}


@pytest.mark.parametrize("block", [b for b in EXAMPLES if b.runs and b.language == "bash"],
                         ids=lambda b: b.where)
def test_every_bash_example_is_made_of_commands_the_runner_runs(block: Block) -> None:
    try:
        assert list(commands(block.code))
    except Unsupported as e:
        pytest.fail(f"{block.where}: {e}; mark it <!-- notest: why --> if it cannot run here")


def test_the_runner_joins_lines_pipes_printf_and_writes_heredocs() -> None:
    code = ("# a comment\n"
            "deltabus topics --create --topic t \\\n  --partitions 3   # a trailing comment\n"
            "printf 'a:1\\nb:2\\n' | \\\n  deltabus console-producer --topic t\n"
            "cat > plan.json <<'EOF'\n{\"version\": 1}\nEOF\n")
    assert list(commands(code)) == [
        Deltabus(("topics", "--create", "--topic", "t", "--partitions", "3"), None,
                 "deltabus topics --create --topic t  --partitions 3   # a trailing comment"),
        Deltabus(("console-producer", "--topic", "t"), "a:1\nb:2\n",
                 "printf 'a:1\\nb:2\\n' |  deltabus console-producer --topic t"),
        WriteFile("plan.json", '{"version": 1}\n', "cat > plan.json <<'EOF'")]


def test_a_commented_print_says_what_it_prints() -> None:
    page = Path("page.md")
    block = Block(page, 10, "python", "x = [1]\nprint(x, 2)   # [1] 2\nprint(3)\n", None)
    assert expected_prints(block) == {12: "[1] 2"}
    prints = Prints("page.md")
    exec(compile("\n" * 10 + block.code, "page.md", "exec"), {"print": prints})
    prints.check(block)
    wrong = Block(page, 10, "python", "x = [1]\nprint(x, 2)   # [1] 3\n", None)
    with pytest.raises(AssertionError, match="printed '\\[1\\] 2', the page says '\\[1\\] 3'"):
        prints.check(wrong)


@pytest.mark.parametrize("line", ["deltabus cluster start --root s3://b/x",
                                  "kcat -b 127.0.0.1:9092 -L", "echo hi | deltabus topics --list",
                                  "printf '%s' x | deltabus topics --list"])
def test_the_runner_refuses_what_it_does_not_run(line: str) -> None:
    with pytest.raises(Unsupported):
        list(commands(line + "\n"))


# ---- running them --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def registry_url(cluster: Any) -> Iterator[str]:
    """The shared cluster's schema registry behind a REST door, as `make run` serves it."""
    from deltabus.rpc.schema_registry_http import SchemaRegistryServer

    server = SchemaRegistryServer(cluster.controller.schema_registry, "127.0.0.1", 0).start()
    yield server.url
    server.stop()


def cli(argv: list[str], stdin: str | None) -> tuple[int, str, str]:
    """`deltabus ARGV` in this process, as the console script runs it."""
    from deltabus.cli.main import main

    out, err, stdin_before = io.StringIO(), io.StringIO(), sys.stdin
    sys.stdin = io.StringIO(stdin or "")
    try:
        with redirect_stdout(out), redirect_stderr(err):
            rc = main(argv)
    finally:
        sys.stdin = stdin_before
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", [p for p in PAGES if any(b.runs for b in blocks(p))],
                         ids=lambda p: p.name)
def test_the_examples_of_each_page_run(page: Path, cluster: Any, spark: Any, registry_url: str,
                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    addresses = {"http://127.0.0.1:8081": registry_url,
                 "127.0.0.1:9192": cluster.bootstrap_servers,
                 "127.0.0.1:9092": cluster.kafka_bootstrap_servers}
    assert sorted(addresses) == sorted(ADDRESSES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DELTABUS_BOOTSTRAP_SERVER", cluster.bootstrap_servers)
    prints = Prints(str(page))
    namespace: dict[str, Any] = {"__name__": "__docs__", "spark": spark, "print": prints}
    ran = 0
    with left_as_found(cluster, spark, namespace):
        for block in blocks(page):
            if not block.runs:
                continue
            code = localized(block.code, addresses)
            if block.language == "python":
                exec(compile(python_source(block, code), str(page), "exec"), namespace)
                prints.check(block)
            else:
                try:
                    run_bash(code, cli, Path(os.getcwd()))
                except AssertionError as e:
                    raise AssertionError(f"{block.where}: {e}") from None
            ran += 1
    assert ran == sum(b.runs for b in blocks(page))


@contextmanager
def left_as_found(cluster: Any, spark: Any, namespace: dict[str, Any]) -> Iterator[None]:
    """Undo what a page's examples made on the shared cluster and Spark session: clusters they
    started, streaming queries, temporary views, and the topics, groups, ACLs, client quotas,
    SCRAM users and schema subjects they created."""
    from deltabus import AdminClient, Cluster

    views = {t.name for t in spark.catalog.listTables() if t.isTemporary}
    with AdminClient(cluster.bootstrap_servers) as admin:
        before = _state(admin)
    try:
        yield
    finally:
        for value in list(namespace.values()):
            if isinstance(value, Cluster) and value is not cluster:
                value.stop()
        for query in spark.streams.active:
            query.stop()
        for table in spark.catalog.listTables():
            if table.isTemporary and table.name not in views:
                spark.catalog.dropTempView(table.name)
        with AdminClient(cluster.bootstrap_servers) as admin:
            _restore(admin, before, _state(admin))


def _restore(admin: Any, before: dict[str, Any], after: dict[str, Any]) -> None:
    from deltabus import AclBindingFilter, UserScramCredentialDeletion
    from deltabus.quotas import QuotaAlteration

    if after["groups"] - before["groups"]:
        admin.delete_consumer_groups(after["groups"] - before["groups"])
    if after["topics"] - before["topics"]:
        admin.delete_topics(after["topics"] - before["topics"])
    if after["acls"] - before["acls"]:
        admin.delete_acls([AclBindingFilter(a.resource_type, a.resource_name, a.pattern_type,
                                            a.principal, a.host, a.operation, a.permission)
                           for a in after["acls"] - before["acls"]])
    quotas = [QuotaAlteration(entity, tuple((key, before["quotas"].get(entity, {}).get(key))
                                            for key in values))
              for entity, values in after["quotas"].items()
              if values != before["quotas"].get(entity)]
    if quotas:
        admin.alter_client_quotas(quotas)
    users = [UserScramCredentialDeletion(user, info.mechanism)
             for user, description in after["users"].items() if user not in before["users"]
             for info in description.scram_credential_infos]
    if users:
        admin.alter_user_scram_credentials(users)
    for subject in after["subjects"] - before["subjects"]:
        admin.schema_registry.delete_subject(subject, False)
        admin.schema_registry.delete_subject(subject, True)


def _state(admin: Any) -> dict[str, Any]:
    return {"topics": set(admin.list_topics()),
            "groups": {group for group, _ in admin.list_consumer_groups()},
            "acls": set(admin.describe_acls()),
            "quotas": admin.describe_client_quotas(),
            "users": admin.describe_user_scram_credentials(),
            "subjects": set(admin.schema_registry.subjects(False, ""))}
