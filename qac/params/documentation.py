"""``docs/parameters.md``, generated from the sections (``qac profile docs`` writes it)."""

from __future__ import annotations

import typing
from typing import Annotated, Any, Literal, Mapping, Union

from pydantic import BaseModel

from qac.params.errors import unwrap
from qac.params.sections import Params


# Fields holding entries of their own: (type argument of the entry, key suffix, how the table names it).
_ENTRY_CONTAINERS = {dict: (1, ".<name>", "mapping of name to entry"), list: (0, "[]", "list of entries")}

def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        base, *metadata = typing.get_args(annotation)
        return _type_name(base) + _constraint_text(metadata)
    if origin in (Union, getattr(__import__("types"), "UnionType", Union)):
        args = typing.get_args(annotation)
        names = [_type_name(arg) for arg in args if arg is not type(None)]
        text = " or ".join(names)
        return text + (" or null" if type(None) in args else "")
    if origin is Literal:
        return " | ".join(str(value).lower() if isinstance(value, bool) else str(value)
                            for value in typing.get_args(annotation))
    if origin is dict:
        key, value = typing.get_args(annotation)
        return f"mapping of {_type_name(key)} to {_type_name(value)}"
    if origin is list:
        return f"list of {_type_name(typing.get_args(annotation)[0])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    return {int: "integer", float: "number", str: "string", bool: "boolean", Any: "any"}.get(
        annotation, getattr(annotation, "__name__", str(annotation)))


def _constraint_text(metadata: list) -> str:
    parts = []
    for item in metadata:
        for attribute, symbol in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(item, attribute, None)
            if value is not None:
                parts.append(f"{symbol} {value}")
        for inner in getattr(item, "metadata", []) or []:
            for attribute, symbol in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
                value = getattr(inner, attribute, None)
                if value is not None:
                    parts.append(f"{symbol} {value}")
    return f" ({', '.join(parts)})" if parts else ""


def _field_type(info: Any) -> str:
    return _type_name(info.annotation) + _constraint_text(list(info.metadata))


def _format_value(value: Any) -> str:
    import json

    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= 40 else "(see profiles/base.yaml)"
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else repr(value)


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def parameters_markdown(base: Mapping[str, Any] | None = None) -> str:
    """``docs/parameters.md``: every key of the schema, its type and range, base value and meaning."""
    lines = [
        "# Parameters",
        "",
        "Every key of a params file (`profiles/base.yaml`, each `profiles/<name>.yaml` and the rendered",
        "`profiles/<name>/params.yaml`), generated from the schema in `qac/params/sections.py` by",
        "`qac profile docs` (a test fails while this file is stale). Unknown keys are errors. Every stage checks",
        "the whole file before it loads a model; `qac profile validate NAME` (or a file) checks it alone.",
        "",
        "Types are strict: `\"8\"` is not a number and `true` is not 1; floats may be written `5e-05`,",
        "`1e-4` or `1.0e-4`. *base* is the value in `profiles/base.yaml`; a profile overrides it.",
        "",
        "Rules across keys: a query- or mixed-context variant's `query_count` is at most",
        "`querygen.queries_per_passage`; a variant's `batch_size` is a multiple of its `grad_accumulation`;",
        "`finetune.max_train_queries` fills whole batches of `finetune.batch_size` (unless",
        "`finetune.incomplete_batch: drop`), and the fine-tuning stage checks the same of the training queries it",
        "finds; `finetune.bm25_depth` and `finetune.mine_depth` (less `mine_skip_top`) give at least",
        "`train_n_passages - 1` negatives and stay within the documents the profile keeps of `train_dataset`;",
        "datasets, variants, splits and measures named anywhere are declared; `hpo.space` follows `docs/hpo.md`.",
        "",
    ]

    def section(model: type[BaseModel], prefix: str, values: Any, title: str, description: str | None) -> None:
        lines.append(f"## `{title}`" if prefix else f"## {title}")
        lines.append("")
        if description:
            lines.append(description[0].upper() + description[1:] + ".")
            lines.append("")
        lines.append("| key | type | base | meaning |")
        lines.append("|---|---|---|---|")
        nested = []
        for name, info in model.model_fields.items():
            key = f"{prefix}{name}"
            inner = unwrap(info.annotation)
            value = values.get(name) if isinstance(values, Mapping) else None
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                nested.append((inner, key, value, info.description))
                lines.append(f"| `{key}` | mapping | | {_escape(info.description or '')} (below) |")
                continue
            container = _ENTRY_CONTAINERS.get(typing.get_origin(inner))
            if container:
                index, suffix, kind = container
                item = unwrap(typing.get_args(inner)[index])
                if isinstance(item, type) and issubclass(item, BaseModel):
                    nested.append((item, f"{key}{suffix}", None, info.description))
                    lines.append(f"| `{key}` | {kind} | {_format_value(value)} | "
                                 f"{_escape(info.description or '')} (below) |")
                    continue
            if isinstance(values, Mapping) and name in values:
                shown = _format_value(value)
            elif (info.description or "").startswith("overrides "):
                shown = "as common"
            else:
                shown = "required" if info.is_required() else _format_value(info.get_default(call_default_factory=True))
            lines.append(f"| `{key}` | {_escape(_field_type(info))} | {_escape(shown)} | "
                         f"{_escape(info.description or '')} |")
        lines.append("")
        for inner, key, value, text in nested:
            section(inner, f"{key}.", value or {}, key, text)

    section(Params, "", dict(base or {}), "Top level", None)
    return "\n".join(lines).rstrip() + "\n"
