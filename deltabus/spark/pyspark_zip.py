"""Compiled bytecode for the `pyspark.zip` that Spark's Python workers import.

Why: Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on every Python worker's path, and
pip's PySpark ships that zip with sources only. Python cannot cache what it compiles from a zip,
so every worker Spark starts outside its daemon compiles PySpark again: the driver-side runner
of each streaming query's Python source, and each planning step of a Python data source read
(`spark.read.format("deltabus")`). That is about 1.8 s of CPU a start against 0.6 s with
bytecode, and Spark gives a worker 10 s to connect back: on a loaded two-core machine a
streaming query failed to start with "Python worker failed to connect back".

`python -m deltabus.spark.pyspark_zip` (run by `make setup`) adds a `.pyc` beside every `.py` in
the zip, stamped with the source's time as zipimport checks it; a worker of another Python
version finds the magic number wrong and compiles the source as before. Run again, it does
nothing.
"""

from __future__ import annotations

import copy
import importlib.util
import marshal
import os
import sys
import tempfile
import time
import zipfile


def pyspark_zip_path() -> str:
    """The pyspark.zip of the installed PySpark (`$SPARK_HOME/python/lib/pyspark.zip` of pip's
    layout, where SPARK_HOME is the package directory)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise RuntimeError("PySpark is not installed")
    return os.path.join(os.path.dirname(spec.origin), "python", "lib", "pyspark.zip")


def _bytecode(source: bytes, filename: str, date_time: tuple[int, ...]) -> bytes:
    """A .pyc of `source` as zipimport accepts it: magic, flags 0, the source's time (its zip
    entry's local DOS time, as zipimport reads it), its size, the marshalled code."""
    mtime = int(time.mktime(tuple(date_time) + (0, 0, -1)))  # type: ignore[arg-type]
    code = compile(source, filename, "exec", dont_inherit=True)
    return (importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little")
            + (mtime & 0xFFFFFFFF).to_bytes(4, "little")
            + (len(source) & 0xFFFFFFFF).to_bytes(4, "little") + marshal.dumps(code))


def add_bytecode(path: str) -> int:
    """Rewrite the zip at `path` with a .pyc beside each .py that lacks one and compiles; how
    many it added.
    The new zip replaces the old one in one rename, so a worker starting meanwhile reads either."""
    with zipfile.ZipFile(path) as source:
        entries = source.infolist()
        names = {entry.filename for entry in entries}
        missing = [e for e in entries
                   if e.filename.endswith(".py") and e.filename + "c" not in names]
        if not missing:
            return 0
        fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".zip.tmp")
        os.close(fd)
        added = 0
        try:
            with zipfile.ZipFile(temporary, "w", zipfile.ZIP_DEFLATED) as target:
                for entry in entries:  # a copy: writing an entry moves its header offset
                    target.writestr(copy.copy(entry), source.read(entry))
                for entry in missing:
                    try:
                        pyc = _bytecode(source.read(entry), f"{path}/{entry.filename}",
                                        entry.date_time)
                    except SyntaxError:  # a file Python never imports (a test's sample)
                        continue
                    target.writestr(zipfile.ZipInfo(entry.filename + "c", entry.date_time),
                                    pyc)
                    added += 1
            os.chmod(temporary, os.stat(path).st_mode & 0o777)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    return added


def main() -> None:
    path = pyspark_zip_path()
    if not os.path.exists(path):  # a PySpark that is not pip's: its workers' path is its own
        print(f"no {path}: nothing to compile")
        return
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)  # PySpark's own tests' sources
        added = add_bytecode(path)
    print(f"{path}: {added} modules compiled" if added else f"{path}: already compiled")


if __name__ == "__main__":
    main()
    sys.exit(0)
