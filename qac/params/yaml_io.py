"""Reading and writing params YAML as DVC does (YAML 1.2 numbers), and the line of every key."""

from __future__ import annotations

import math
import re
from typing import Any


def yaml_loader():
    """A PyYAML SafeLoader that reads scalars by YAML 1.2, as DVC reads and records params files.

    DVC reads a params file with ruamel.yaml's YAML 1.2 rules and writes what it read into the lock.
    PyYAML alone follows YAML 1.1, where ``010`` is eight, ``yes`` and ``off`` are booleans and ``1:30``
    is ninety: a stage would then train with one value while the lock records another. So the
    implicit types are ruamel.yaml's own YAML 1.2 table (the reader DVC uses, not a copy of it), and
    integers are built as YAML 1.2 builds them (``010`` ten, ``0o10`` eight, no base 60). A key written
    twice is an error, as in DVC's reader.
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

            def construct_object(self, node, deep=False):
                # An explicit tag on a value it cannot hold (`!!int 1:30`, `!!float x`) is a YAML error
                # with its line, not a ValueError from deep inside the constructor.
                try:
                    return super().construct_object(node, deep=deep)
                except (ValueError, TypeError, KeyError, OverflowError) as error:
                    if isinstance(error, yaml.YAMLError):
                        raise
                    raise yaml.constructor.ConstructorError(
                        None, None, f"{node.value!r} cannot be read as {node.tag.rsplit(':', 1)[-1]} ({error})",
                        node.start_mark) from None

        ParamsLoader.yaml_implicit_resolvers = _yaml12_resolvers()
        ParamsLoader.add_constructor("tag:yaml.org,2002:int", _construct_yaml12_int)
        ParamsLoader.add_constructor("tag:yaml.org,2002:float", _construct_yaml12_float)
        _LOADER = ParamsLoader
    return _LOADER


def _yaml12_resolvers() -> dict:
    """First character -> ``[(tag, pattern)]``: ruamel.yaml's implicit types for YAML 1.2 (DVC's reader)."""
    from ruamel.yaml.resolver import implicit_resolvers

    table: dict = {}
    for versions, tag, regexp, first_chars in implicit_resolvers:
        if (1, 2) in versions:
            pattern = re.compile(regexp.pattern, regexp.flags)
            for first in first_chars:
                table.setdefault(first, []).append((tag, pattern))
    return table


def _signed(text: str) -> tuple[int, str]:
    text = text.replace("_", "")
    return (-1 if text[:1] == "-" else 1), (text[1:] if text[:1] in ("-", "+") else text)


def _construct_yaml12_int(loader, node) -> int:
    # YAML 1.2: a leading zero is decimal; octal needs 0o (ruamel.yaml's reading, hence DVC's).
    sign, digits = _signed(loader.construct_scalar(node))
    base = {"0b": 2, "0o": 8, "0x": 16}.get(digits[:2])
    return sign * (int(digits[2:], base) if base else int(digits, 10))


def _construct_yaml12_float(loader, node) -> float:
    # YAML 1.2 has no base-60 floats (1:30.5 stays the string it is; `!!float 1:30` is an error).
    sign, digits = _signed(loader.construct_scalar(node))
    if digits.lower() == ".inf":
        return sign * math.inf
    if digits.lower() == ".nan":
        return math.nan
    return sign * float(digits)


def yaml11_reading(text: str):
    """What a YAML 1.1 reader (PyYAML, older tools) makes of the plain scalar ``text`` when that is not the
    string YAML 1.2 reads: ``'yes'`` -> True, ``'1:30'`` -> 90; None when both read it alike."""
    import yaml

    tag = yaml.resolver.Resolver().resolve(yaml.ScalarNode, text, (True, False))
    if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"):
        return None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None


_LOADER = None
_DUMPERS: dict = {}
_YAML12_FLOAT = r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"


def yaml_dumper(colons_in_flow: bool = False):
    """A PyYAML SafeDumper that quotes strings YAML 1.1 or 1.2 would read as other types (``'5e-05'``, ``'08'``).

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

        # A string DVC's YAML 1.2 reader would take for a number (`08`, `0o10`, `.5`) is quoted too.
        for first, entries in _yaml12_resolvers().items():
            for tag, pattern in entries:
                ParamsDumper.add_implicit_resolver(tag, pattern, [first])
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
        if loader.yaml_version not in (None, (1, 2)):
            # DVC's reader would switch to that version's rules (010 octal, yes a boolean): one reading only.
            version = ".".join(map(str, loader.yaml_version))
            raise yaml.YAMLError(f"the file declares %YAML {version}, whose numbers and booleans DVC reads "
                                 "otherwise than the params' YAML 1.2; remove the %YAML line")
        if node is None:
            return None
        colon = _plain_colon_in_flow(node, set())
        if colon is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"the unquoted value {colon.value!r} holds a colon inside [...] or {{...}}, which "
                "DVC's reader (libyaml) refuses (\"found unexpected ':'\"): quote it, or write the list or "
                "mapping one item a line", colon.start_mark)
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


def _plain_colon_in_flow(node: Any, seen: set[int], in_flow: bool = False) -> Any:
    """The first unquoted scalar with a colon inside a flow collection under ``node``, or None."""
    import yaml

    if id(node) in seen:        # an alias names a node already walked
        return None
    seen.add(id(node))
    if isinstance(node, yaml.ScalarNode):
        return node if in_flow and node.style is None and ":" in node.value else None
    children = [child for pair in node.value for child in pair] if isinstance(node, yaml.MappingNode) else node.value
    for child in children:
        found = _plain_colon_in_flow(child, seen, in_flow or bool(node.flow_style))
        if found is not None:
            return found
    return None


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
