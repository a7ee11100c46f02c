"""A part asked for without its extra fails in one line naming the extra and the missing module.

Here the extras are installed, so a fresh interpreter hides one of their modules
(`sys.modules[name] = None` makes importing it raise ModuleNotFoundError, as a missing
package does); tests/test_packaging.py checks the same in a real client install.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from deltabus import extras


def _fails_with(statement: str, hidden: str) -> str:
    """The last line of stderr when a fresh interpreter without `hidden` runs `statement`."""
    code = f"import sys\nsys.modules[{hidden!r}] = None\n{statement}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0, out.stdout
    return out.stderr.strip().splitlines()[-1]


def test_a_missing_library_names_the_part_the_module_and_the_install() -> None:
    with pytest.raises(ModuleNotFoundError) as caught, extras.needs("deltabus.Cluster", "server"):
        import deltabus_no_such_library  # noqa: F401
    assert str(caught.value) == (
        "deltabus.Cluster needs the server install (deltabus_no_such_library is not "
        "installed): pip install 'deltabus[server]'")
    assert caught.value.name == "deltabus_no_such_library"


def test_a_missing_deltabus_module_is_no_extras_doing() -> None:
    with pytest.raises(ModuleNotFoundError, match="No module named 'deltabus.no_such_module'"), \
            extras.needs("deltabus.Cluster", "server"):
        import deltabus.no_such_module  # noqa: F401


def test_import_deltabus_needs_no_server_library() -> None:
    code = ("import sys\nfor name in ('pyspark', 'deltalake', 'pandas'):\n"
            "    sys.modules[name] = None\n"
            "import deltabus\nfrom deltabus import Consumer, Producer, AdminClient\n")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name", ["Cluster", "local_spark"])
def test_a_server_part_without_pyspark_says_to_install_the_server(name: str) -> None:
    assert _fails_with(f"from deltabus import {name}", "pyspark") == (
        f"ModuleNotFoundError: deltabus.{name} needs the server install (pyspark is not "
        "installed): pip install 'deltabus[server]'")
    assert _fails_with(f"import deltabus\ndeltabus.{name}", "deltalake").startswith(
        f"ModuleNotFoundError: deltabus.{name} needs the server install (deltalake is not "
        "installed)")


@pytest.mark.parametrize(("schema_type", "library"),
                         [("AVRO", "fastavro"), ("JSON", "jsonschema"),
                          ("PROTOBUF", "grpc_tools")])
def test_a_schema_type_without_its_library_says_to_install_the_schemas(
        schema_type: str, library: str) -> None:
    statement = ("from deltabus import schemas\n"
                 f"schemas.parse(schemas.SchemaType.{schema_type}, '{{}}', {{}})")
    assert _fails_with(statement, library) == (
        f"ModuleNotFoundError: the {schema_type} schema type needs the schemas install "
        f"({library} is not installed): pip install 'deltabus[schemas]'")


def test_the_cli_without_pyspark_refuses_cluster_start_in_one_line() -> None:
    code = ("import sys\nsys.modules['pyspark'] = None\n"
            "from deltabus.cli.main import main\n"
            "sys.exit(main(['cluster', 'start', '--brokers', '1']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (out.returncode, out.stderr) == (1, (
        "Error: deltabus cluster start needs the server install (pyspark is not installed): "
        "pip install 'deltabus[server]'\n"))
