"""The code in a store: bedside's views and macros come from bedside's migrations, never from the file.

A store file is data that whoever can write it may have changed. DuckDB keeps views and macros in
the file, so a view named ``run`` could read ``/proc/self/environ``, and a macro named ``lower``
shadows the built-in one. Every connection to a store is locked down (``STORE_CONFIG``: no file,
network or extension), and on open the store's code is compared with what our migrations define
for the versions the store records (``expected_catalog``, built once per versions in a sandbox):

- each of our views must be a view with the text DuckDB prints for our definition;
- each of our macros likewise, and there may be no other macro (in any schema) and no user type:
  those change what a built-in name means;
- each of our tables must be a table, not a view someone put in its place.

The store's owner (a writable open) first puts our definitions back (the last ``CREATE OR REPLACE``
of each name in the migrations), so a view of ours replaced in the file is simply replaced again;
a reader cannot write, so it refuses. What remains wrong is a ``StoreTamperedError`` naming each
object. Other views in the file are never read: the console reads only the views named here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import duckdb

from ..errors import StoreTamperedError
from . import Fingerprint, Schema, open_sandbox, sql

DEFINES = re.compile(r"^\s*CREATE\s+OR\s+REPLACE\s+(VIEW|MACRO)\s+(\w+)", re.IGNORECASE | re.MULTILINE)
CATALOG_PARTS = ("views", "macros", "types", "tables")
Versions = tuple[tuple[str, str, int], ...]
"""(package, namespace, version) of each schema: the migrations that made a store."""


@dataclass(frozen=True)
class Catalog:
    """The code of a database as DuckDB prints it: views and macros by name, user types, tables."""

    views: dict[str, str]
    macros: dict[str, str]
    types: frozenset[str]
    tables: frozenset[str]


def read_catalog(con: duckdb.DuckDBPyConnection) -> Catalog:
    """What the database of ``con`` holds (its own objects; DuckDB's built-in ones aside)."""
    views, macros, types, tables = (con.execute(sql(f"catalog_{part}")).fetchall() for part in CATALOG_PARTS)
    texts: dict[str, list[str]] = {}
    for schema, name, kind, parameters, definition in macros:
        key = name if schema == "main" else f"{schema}.{name}"
        texts.setdefault(key, []).append(f"{kind}({', '.join(parameters)}) AS {definition}")
    return Catalog(
        views=dict(views),
        macros={name: "\n".join(overloads) for name, overloads in texts.items()},
        types=frozenset(name for (name,) in types),
        tables=frozenset(name for (name,) in tables),
    )


@cache
def expected_catalog(versions: Versions) -> Catalog:
    """The catalog our migrations make, each schema up to its version (built in an empty sandbox)."""
    con = open_sandbox()
    try:
        for text in _migrations(versions):
            con.execute(text)
        return read_catalog(con)
    finally:
        con.close()


@cache
def definitions(versions: Versions) -> dict[str, str]:
    """The last ``CREATE OR REPLACE`` statement of each of our views and macros, by name, in migration order."""
    con = open_sandbox()
    latest: dict[str, str] = {}
    try:
        for text in _migrations(versions):
            for statement in con.extract_statements(text):
                if found := DEFINES.search(statement.query):
                    latest.pop(found.group(2), None)
                    latest[found.group(2)] = statement.query
    finally:
        con.close()
    return latest


def _migrations(versions: Versions) -> Iterator[str]:
    """The text of every migration up to ``versions``, in the order they were applied."""
    for package, namespace, version in versions:
        for number, _, text in Schema(namespace, package).migrations():
            if number <= version:
                yield text


def catalog_problems(found: Catalog, expected: Catalog) -> list[str]:
    """What in ``found`` is not the code ``expected`` defines, one phrase each (empty when it is all ours)."""
    problems = [f"view {name!r} is not bedside's" for name in _differing(found.views, expected.views)]
    problems += [f"macro {name!r} is not bedside's" for name in _differing(found.macros, expected.macros)]
    problems += [f"macro {name!r} is not bedside's" for name in sorted(found.macros.keys() - expected.macros.keys())]
    problems += [f"type {name!r} is not bedside's" for name in sorted(found.types - expected.types)]
    problems += [
        f"{name!r} is a view where bedside keeps a table" for name in sorted(expected.tables & found.views.keys())
    ]
    return problems


def restore(con: duckdb.DuckDBPyConnection, versions: Versions, found: Catalog) -> bool:
    """Put our definition back for every view and macro of ours that ``found`` lacks or holds changed (nothing when
    a newer bedside wrote the store: its definitions are not ours to replace); whether anything was put back."""
    if _newer(versions):
        return False
    expected = expected_catalog(versions)
    changed = set(_differing(found.views, expected.views)) | set(_differing(found.macros, expected.macros))
    restored = [statement for name, statement in definitions(versions).items() if name in changed]
    for statement in restored:
        con.execute(statement)
    return bool(restored)


_checked: dict[Path, tuple[Fingerprint, Versions]] = {}


def checked_before(path: Path, seen: Fingerprint, versions: Versions) -> bool:
    """Whether this process found the store's code to be ours when its files were exactly as ``seen`` (taken
    before they were opened): reading a store again costs no second look at its catalog."""
    return _checked.get(path) == (seen, versions)


def check_catalog(
    con: duckdb.DuckDBPyConnection,
    versions: Versions,
    path: Path,
    seen: Fingerprint | None = None,
    found: Catalog | None = None,
) -> None:
    """StoreTamperedError naming every object in the store at ``path`` (open on ``con``) that is not our code;
    with ``seen`` (the files' fingerprint before they were opened), a store found clean is remembered so.
    ``found``: the store's catalog as just read, when nothing has changed it since (DuckDB lists every function,
    its own thousands included, to find the macros: about 60 ms a read)."""
    problems = catalog_problems(found or read_catalog(con), expected_catalog(versions))
    if not problems:
        if seen is not None:
            _checked[path] = (seen, versions)
        return
    newer = _newer(versions)
    written_by = f"; its schema is newer than this bedside's ({', '.join(newer)})" if newer else ""
    raise StoreTamperedError(
        f"{path} holds code bedside did not write ({'; '.join(problems)}){written_by}: it is not read. "
        f"A store is data, never code: rebuild it from the telemetry with bedside collect {path.parent} --rebuild"
    )


def _newer(versions: Versions) -> list[str]:
    """'namespace version' of each schema the store has newer than our newest migration."""
    return [
        f"{namespace} {version}" for package, namespace, version in versions if version > _newest(package, namespace)
    ]


def _differing(found: dict[str, str], expected: dict[str, str]) -> list[str]:
    return sorted(name for name, text in expected.items() if found.get(name) != text)


@cache
def _newest(package: str, namespace: str) -> int:
    return max((number for number, _, _ in Schema(namespace, package).migrations()), default=0)
