"""The Document contract (ARCHITECTURE.md contract 1): one row per document, in parquet.

Required columns: `id` (stable string), `text`, `source`, `meta` (map<string,string> of the input's
other fields: strings as they were, anything else as its JSON text). Stages add columns:

| column                  | type    | added by            |
|-------------------------|---------|---------------------|
| n_tokens                | int64   | token counting      |
| dup_cluster             | string  | dedup (cluster id)  |
| dup_count               | int64   | dedup (cluster size)|
| lang, lang_score        | string, double | language id  |
| quality.<name>          | double  | scorers (higher = more of <name>) |
| filter.<name>           | bool    | annotation filters (True = passes) |
| filter.<name>.reason    | string  | why it failed (null when it passes) |

Column names with dots are flat parquet columns (in Spark write them with backticks; see
`spark_col`). Unknown extra columns are allowed; known ones must have the listed types.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

import pyarrow as pa

DOCUMENT_SCHEMA_VERSION = "document/1"

META_TYPE = pa.map_(pa.string(), pa.string())

REQUIRED = {
    "id": pa.string(),
    "text": pa.string(),
    "source": pa.string(),
    "meta": META_TYPE,
}
OPTIONAL = {
    "n_tokens": pa.int64(),
    "dup_cluster": pa.string(),
    "dup_count": pa.int64(),
    "lang": pa.string(),
    "lang_score": pa.float64(),
}
QUALITY_PREFIX = "quality."
FILTER_PREFIX = "filter."
REASON_SUFFIX = ".reason"

BASE_SCHEMA = pa.schema([pa.field(k, v, nullable=(k == "meta")) for k, v in REQUIRED.items()])


def quality_column(name: str) -> str:
    return f"{QUALITY_PREFIX}{name}"


def filter_column(name: str) -> str:
    return f"{FILTER_PREFIX}{name}"


def filter_reason_column(name: str) -> str:
    return f"{FILTER_PREFIX}{name}{REASON_SUFFIX}"


def spark_col(name: str) -> str:
    """Backtick-quote a column name for Spark SQL expressions (dots are otherwise struct access)."""
    return f"`{name}`"


def meta_value(value: Any) -> str:
    """How one input field is stored in `meta`: strings unchanged, anything else as JSON text."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _compatible(actual: pa.DataType, expected: pa.DataType) -> bool:
    if actual.equals(expected):
        return True
    # large_string / string_view and float32 are read back the same way by every consumer
    if pa.types.is_string(expected):
        return pa.types.is_string(actual) or pa.types.is_large_string(actual) or pa.types.is_string_view(actual)
    if pa.types.is_floating(expected):
        return pa.types.is_floating(actual)
    if pa.types.is_integer(expected):
        return pa.types.is_integer(actual)
    if pa.types.is_map(expected):
        return pa.types.is_map(actual)
    return False


def schema_problems(schema: pa.Schema) -> list[str]:
    """Every way `schema` breaks the Document contract; empty when it conforms."""
    problems: list[str] = []
    names = set(schema.names)
    for name, typ in REQUIRED.items():
        if name not in names:
            problems.append(f"missing required column '{name}' ({typ})")
        elif not _compatible(schema.field(name).type, typ):
            problems.append(f"column '{name}' is {schema.field(name).type}, expected {typ}")
    for field in schema:
        name, typ = field.name, field.type
        if name in OPTIONAL and not _compatible(typ, OPTIONAL[name]):
            problems.append(f"column '{name}' is {typ}, expected {OPTIONAL[name]}")
        elif name.startswith(QUALITY_PREFIX) and not pa.types.is_floating(typ):
            problems.append(f"score column '{name}' is {typ}, expected a floating type")
        elif name.startswith(FILTER_PREFIX):
            if name.endswith(REASON_SUFFIX):
                if not _compatible(typ, pa.string()):
                    problems.append(f"filter reason column '{name}' is {typ}, expected string")
            elif not pa.types.is_boolean(typ):
                problems.append(f"filter column '{name}' is {typ}, expected bool")
    return problems


def score_columns(schema_or_names: pa.Schema | Iterable[str]) -> list[str]:
    names = schema_or_names.names if isinstance(schema_or_names, pa.Schema) else list(schema_or_names)
    return [n for n in names if n.startswith(QUALITY_PREFIX)]
