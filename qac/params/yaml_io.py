"""Reading and writing params YAML as DVC does (YAML 1.2 numbers), and the line of every key."""

from __future__ import annotations

import re
from typing import Any


def yaml_loader():
    """A PyYAML SafeLoader that reads numbers as YAML 1.2 does, as DVC reads and writes params files.

    YAML 1.1 (PyYAML) wants a dot and a signed exponent in a float (``5.0e-05``); DVC's ``-S key=5e-5``
    writes ``5e-05`` and people type ``1e-4``: both are floats here. And YAML 1.1 reads ``24:00:00`` as
    the base-60 integer 86400, which DVC writes unquoted (a string in YAML 1.2) when it rewrites the
    file: here it stays the string it is.
    """
    import yaml

    global _LOADER
    if _LOADER is None:
        class ParamsLoader(yaml.SafeLoader):
            def construct_mapping(self, node, deep=False):
                # A key written twice is an error (YAML 1.2, and DVC's reader): PyYAML alone keeps the
                # last value, so a second `lr:` further down would silently win over the first.
                seen = set()
                for key_node, _ in node.value:
                    if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                        if key_node.value in seen:
                            raise yaml.constructor.ConstructorError(
                                "while constructing a mapping", node.start_mark,
                                f"the key {key_node.value!r} is written twice in one mapping", key_node.start_mark)
                        seen.add(key_node.value)
                return super().construct_mapping(node, deep=deep)

        sexagesimal = re.compile(r"\|\[-\+\]\?\[(?:0-9|1-9)\]\[0-9_\]\*\(\?::\[0-5\]\?\[0-9\]\)\+(?:\\\.\[0-9_\]\*)?")
        resolvers = {}
        for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items():
            kept = []
            for tag, pattern in entries:
                if tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float"):
                    pattern = re.compile(sexagesimal.sub("", pattern.pattern), pattern.flags)
                kept.append((tag, pattern))
            resolvers[first] = kept
        ParamsLoader.yaml_implicit_resolvers = resolvers
        ParamsLoader.add_implicit_resolver(
            "tag:yaml.org,2002:float",
            re.compile(_YAML12_FLOAT),
            list("-+0123456789."))
        _LOADER = ParamsLoader
    return _LOADER


_LOADER = None
_DUMPERS: dict = {}
_YAML12_FLOAT = r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"


def yaml_dumper(colons_in_flow: bool = False):
    """A PyYAML SafeDumper that quotes strings :func:`yaml_loader` would read as floats (``'5e-05'``).

    With ``default_flow_style=None`` (a collection of scalars on one line) it keeps a collection holding a
    string with a colon in block style. `dvc exp run -S` rewrites a params file with ruamel.yaml, which
    drops the quotes around ``'24:00:00'`` or ``'https://...'`` as YAML 1.2 allows; inside ``{...}`` or
    ``[...]`` libyaml (YAML 1.1) then cannot read the file back ("found unexpected ':'"), and DVC reads
    params with libyaml wherever ruamel.yaml's C extension is installed. On a line of its own the unquoted
    value reads the same in both. ``colons_in_flow``: without that rule, as renders before it wrote.
    """
    import yaml

    if not _DUMPERS:
        class EarlierParamsDumper(yaml.SafeDumper):
            pass

        EarlierParamsDumper.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(_YAML12_FLOAT),
                                                  list("-+0123456789."))

        class ParamsDumper(EarlierParamsDumper):
            def represent_mapping(self, tag, mapping, flow_style=None):
                node = super().represent_mapping(tag, mapping, flow_style)
                return self._block_if_colons(node, [item for pair in node.value for item in pair])

            def represent_sequence(self, tag, sequence, flow_style=None):
                node = super().represent_sequence(tag, sequence, flow_style)
                return self._block_if_colons(node, node.value)

            @staticmethod
            def _block_if_colons(node, items):
                """``node`` in block style if it would be a flow collection with a colon in one of its strings."""
                if node.flow_style and any(isinstance(item, yaml.ScalarNode) and ":" in item.value for item in items):
                    node.flow_style = False
                return node

        _DUMPERS.update({True: EarlierParamsDumper, False: ParamsDumper})
    return _DUMPERS[colons_in_flow]


# Values a params file may hold once its aliases are expanded: a profile holds a few thousand, while nested
# aliases (each naming the one before nine times) reach millions from a dozen lines, and every reader after
# the parser (the schema, the line finder) would walk them all.
MAX_EXPANDED_VALUES = 100_000


class TooManyValues(Exception):
    """Aliases that expand a YAML text past :data:`MAX_EXPANDED_VALUES` values."""


def read_yaml(text: str) -> Any:
    """The YAML ``text`` as Python values, read as DVC reads params files (:func:`yaml_loader`).

    Raises ``yaml.YAMLError`` (with the line and column where PyYAML has them), also for aliases
    that would expand past :data:`MAX_EXPANDED_VALUES` values.
    """
    import yaml

    loader = yaml_loader()(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}) > MAX_EXPANDED_VALUES:
            anchor = _first_anchor_line(text)
            raise yaml.YAMLError(f"its aliases expand to more than {MAX_EXPANDED_VALUES:,} values (anchor at line "
                                 f"{anchor})" if anchor else
                                 f"it holds more than {MAX_EXPANDED_VALUES:,} values (a profile holds a few thousand)")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _expanded_size(node: Any, sizes: dict[int, int]) -> int:
    """Values under ``node`` with every alias expanded; each node is sized once (an alias is the node it names)."""
    import yaml

    if id(node) not in sizes:
        sizes[id(node)] = 1      # a node that (through a merge key) contains itself counts once
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
        else:
            children = []
        total = 1
        for child in children:
            total += _expanded_size(child, sizes)
            if total > MAX_EXPANDED_VALUES:
                break
        sizes[id(node)] = total
    return sizes[id(node)]


def _first_anchor_line(text: str) -> int | None:
    for number, line in enumerate(text.splitlines(), 1):
        if re.search(r"(^|[\s\[{,:-])&\S", line):
            return number
    return None


def key_lines(text: str) -> dict[str, int]:
    """Dotted key -> 1-based line of every mapping key (and list item) in a YAML text."""
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml_loader())
    except yaml.YAMLError:
        return {}
    lines: dict[str, int] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
                lines.setdefault(key, key_node.start_mark.line + 1)
                walk(value_node, key)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                key = f"{prefix}.{index}"
                lines.setdefault(key, item.start_mark.line + 1)
                walk(item, key)

    walk(root, "")
    return lines
