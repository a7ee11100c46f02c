"""`deltabus schemas` against the shared cluster (the registry over gRPC): register from a file,
list, describe, check and set compatibility, delete, and refusals as one line."""

from __future__ import annotations

import json
from pathlib import Path

PAYMENT = {"type": "record", "name": "Payment", "namespace": "shop",
           "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "double"}]}


def _file(tmp_path: Path, name: str, schema: dict) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(schema))
    return str(path)


def _with_field(name: str, **extra: object) -> dict:
    return {**PAYMENT, "fields": [*PAYMENT["fields"], {"name": name, "type": "string", **extra}]}


def test_register_list_describe_and_delete_a_subjects_versions(cli, topic_name, tmp_path) -> None:
    subject = f"{topic_name}-value"
    v1 = _file(tmp_path, "v1.avsc", PAYMENT)
    v2 = _file(tmp_path, "v2.avsc", _with_field("currency", default="EUR"))
    rc, out, _ = cli("schemas", "--register", "--subject", subject, "--schema-file", v1)
    assert rc == 0 and out.startswith("Registered schema id ") and out.endswith(" version 1\n")
    first_id = int(out.split()[3])
    rc, out, _ = cli("schemas", "--register", "--subject", subject, "--schema-file", v2)
    assert rc == 0 and out.endswith(f"as subject {subject} version 2\n")
    rc, out, _ = cli("schemas", "--list")
    assert rc == 0 and subject in out.splitlines()
    rc, out, _ = cli("schemas", "--list", "--subject", subject)
    assert out.splitlines()[0] == "Subject\tVersion\tId\tDeleted"
    assert out.splitlines()[1] == f"{subject}\t1\t{first_id}\tfalse"
    rc, out, _ = cli("schemas", "--describe", "--subject", subject, "--version", "1")
    lines = out.splitlines()
    assert lines[0] == f"Subject: {subject}\tVersion: 1\tId: {first_id}\tType: AVRO"
    assert json.loads("\n".join(lines[1:])) == PAYMENT
    rc, out, _ = cli("schemas", "--describe", "--id", str(first_id))
    assert out.splitlines()[0] == f"Id: {first_id}\tType: AVRO"
    rc, out, _ = cli("schemas", "--delete", "--subject", subject, "--version", "1")
    assert rc == 0 and out == f"Deleted subject {subject} version 1\n"
    rc, out, _ = cli("schemas", "--list", "--subject", subject, "--deleted")
    assert out.splitlines()[1].endswith("\ttrue")
    rc, out, _ = cli("schemas", "--delete", "--subject", subject)
    assert rc == 0 and out == f"Deleted subject {subject} versions 2\n"


def test_compatibility_is_checked_set_and_refusals_are_one_line(cli, topic_name,
                                                                tmp_path) -> None:
    subject = f"{topic_name}-value"
    cli("schemas", "--register", "--subject", subject, "--schema-file",
        _file(tmp_path, "v1.avsc", PAYMENT))
    no_default = _file(tmp_path, "bad.avsc", _with_field("country"))
    rc, out, _ = cli("schemas", "--compatibility", "--subject", subject, "--schema-file",
                     no_default)
    assert rc == 1 and out.splitlines()[0] == "Compatible: false"
    assert "country" in out
    rc, out, err = cli("schemas", "--register", "--subject", subject, "--schema-file", no_default)
    assert rc == 1 and out == ""
    assert err.startswith("Error: Schema being registered is incompatible")
    assert err.rstrip().endswith("(error code 409)") and len(err.splitlines()) == 1
    rc, out, _ = cli("schemas", "--compatibility", "--subject", subject, "--set", "none")
    assert rc == 0 and out == f"Compatibility of {subject}: NONE\n"
    rc, out, _ = cli("schemas", "--compatibility", "--subject", subject)
    assert out == f"Compatibility of {subject}: NONE\n"
    rc, out, _ = cli("schemas", "--register", "--subject", subject, "--schema-file", no_default)
    assert rc == 0 and out.endswith(" version 2\n")
    rc, out, _ = cli("schemas", "--compatibility", "--subject", subject, "--unset")
    assert rc == 0 and out == f"Compatibility of {subject}: NONE\n"  # what it was
    rc, out, _ = cli("schemas", "--compatibility", "--subject", subject)
    assert out == f"Compatibility of {subject}: BACKWARD\n"  # the global level again
    rc, _, err = cli("schemas", "--describe", "--subject", f"{subject}-missing")
    assert rc == 1 and err == f"Error: Subject '{subject}-missing' not found. " \
                              "(error code 40401)\n"
    rc, _, err = cli("schemas", "--register", "--subject", subject)
    assert rc == 1 and err == "Error: --register needs --schema-file\n"
