"""Data files that ship inside the package, read with :mod:`importlib.resources`.

* ``avro/``: the schema registry (``registry.json`` and its ``.avsc`` files);
* ``cql/``: the Cassandra migrations (``V<n>__<name>.cql``);
* ``topology.toml``: the topics and their sizes.

In the repository these entries are symlinks to the real files at the top level
(``schemas/avro``, ``schemas/cql``, ``streams/topology.toml``), which stay the source
(``schemas/README.md``); building a wheel copies the files they point to into
``gnomon/_data/``, so an installed gnomon needs no checkout.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

AVRO = "avro"
CQL = "cql"
TOPOLOGY = "topology.toml"


def data_path(name: str) -> Path:
    """The file system path of the packaged data file or directory ``name``.

    gnomon is installed as files (a wheel unpacks into site-packages, an editable
    install points at ``src/``), so the package's resources are plain paths."""
    resource = resources.files(__name__).joinpath(name)
    if not isinstance(resource, Path):  # a zipped install: not supported
        raise RuntimeError(f"gnomon's data file {name!r} is not on the file system ({resource!r}); "
                           "install gnomon unzipped (pip install)")
    return resource
