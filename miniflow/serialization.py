"""Checkpoints on disk: :func:`save` and :func:`load` (OneFlow's ``flow.save`` / ``flow.load``).

A checkpoint is ONE safetensors file (https://github.com/huggingface/safetensors): the NumPy arrays
of the state are its tensors; everything else (the nesting, dict keys, Python scalars) is a JSON
tree stored as a string in the safetensors metadata, with a placeholder for every array. Nothing is
pickled, so loading a file never runs code.

Tensor keys (the names in the safetensors file) are the dotted paths of the arrays in the state:
dict keys and list/tuple indices joined with ``"."``. A model's ``state_dict()`` saved on its own
is a flat dict, so its arrays are stored under exactly its keys (``0.weight``, ``0.bias``, ...), and
``safetensors.torch.load_file(path)`` gives the tensors under the keys of the equivalent PyTorch
model's ``state_dict()``. A nested state ``{"model": m.state_dict(), "optimizer": opt.state_dict(),
"step": 100}`` stores ``model.0.weight``, ``optimizer.state.0.momentum_buffer``, ...; an array at
the root is stored under ``""``. Two arrays whose paths join to the same key (``{"a.b": x,
"a": {"b": y}}``) are refused by :func:`save`.

The JSON tree (metadata key ``miniflow.tree``) encodes a value as:

=====================================  ==================================================
``None``, ``bool``, ``int``, ``str``   themselves (JSON null, true/false, number, string)
finite ``float``                       a JSON number (Python's shortest round-trip repr)
``nan``, ``inf``, ``-inf``             ``{"float": "nan"}`` / ``"inf"`` / ``"-inf"``
``dict``                               ``{"dict": [[key, value], ...]}`` (order kept; a key
                                       is a JSON string or integer, so int keys load as int)
``list`` / ``tuple``                   ``{"list": [...]}`` / ``{"tuple": [...]}``
``np.ndarray``                         ``{"tensor": key, "dtype": "float32", "shape": [..],
                                       "sha256": hex}``
NumPy scalar (``np.float32(1)``)       the same with ``"scalar": true``
=====================================  ==================================================

Reproducible: one state saves to the same bytes in every process and on every run (the metadata
keys in sorted order), so a checkpoint's checksum identifies its contents.

Integrity: every placeholder holds the SHA-256 of its array's bytes, dtype and shape, and the
metadata holds the SHA-256 of the tree (``miniflow.tree_sha256``): :func:`load` checks all of
them, so an edited or truncated file raises :class:`CheckpointError` naming the file and the key.

Atomicity: :func:`save` writes a temporary file in the target's folder (``.<name>.<pid>.<random>
.tmp``), fsyncs it, renames it over the target with ``os.replace`` and fsyncs the folder, so a
crash at any moment leaves either the previous file or the new one, never a mix. A temporary file
left by a killed process has a unique name: it never blocks a later save (delete it at leisure).
The target is the path with its symlinks resolved: like ``torch.save`` (which opens the path for
writing), a save writes through a symlink and leaves the link in place, and a file replaced keeps
its permission bits. Anything at the target that is not a regular file (a device such as
``/dev/full``, a FIFO, a socket) is refused before anything is written: a rename would replace
the device node itself.

bfloat16 arrays (``ml_dtypes.bfloat16``, miniflow's ``bfloat16``) are stored as safetensors
``BF16``, so ``safetensors.torch.load_file`` gives ``torch.bfloat16`` tensors.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
import stat
import tempfile

import numpy as np
import safetensors
import safetensors.numpy

from .checks import is_integer
from .dtype import bfloat16

__all__ = ["CheckpointError", "check_save_path", "load", "save"]

FORMAT_VERSION = "1"
_FORMAT_KEY, _TREE_KEY, _TREE_HASH_KEY = ("miniflow.checkpoint", "miniflow.tree",
                                          "miniflow.tree_sha256")
_DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
           "float16", "float32", "float64", "complex64", "bfloat16")
"""NumPy dtypes a checkpoint stores (``bfloat16``: ``ml_dtypes.bfloat16``, safetensors ``BF16``)."""
_CHUNK = 16 << 20
"""Bytes per ``os.write`` call when writing a checkpoint."""


class CheckpointError(ValueError):
    """A file that is not a valid miniflow checkpoint: not safetensors, not written by
    :func:`save`, truncated or edited. The message names the file and, where one is to blame,
    the tensor key or the part of the file."""


# ---------------------------------------------------------------------------------------- save
def save(obj, f) -> None:
    """Write ``obj`` (a state) to the checkpoint file ``f`` atomically (see the module docstring):
    ``torch.save(obj, f)``'s first two arguments (PyTorch's pickle options are not there).

    Args:
        obj: any nesting of dicts (str or int keys; ``OrderedDict``/``Counter`` and other dict
            subclasses load back as ``dict``), lists and tuples (tuple subclasses load back as
            ``tuple``) of NumPy arrays (dtypes: bool, (u)int8..64, float16/32/64, bfloat16,
            complex64; any memory layout and byte order: they load back C-contiguous,
            little-endian), NumPy scalars and Python ``None``, ``bool``, ``int``, ``float`` (inf
            and nan included) and ``str``, as ``state_dict()`` methods return them. An array
            that appears twice is stored twice and loads as two arrays.
        f: the file (str, bytes or ``os.PathLike``); its folder must exist. ``.safetensors``
            is the conventional suffix. A symlink is written through: the file it points to is
            replaced (created if missing), the link stays. Or a binary file object (an
            ``io.BytesIO``, a file opened ``"wb"``): the checkpoint's bytes are written to it
            at its position with one ``write`` (no atomic replacement: that is the caller's).

    Raises:
        TypeError: an unsupported value or dict key, naming its place (``state['model']['w']``);
            an ``f`` that is no str, bytes, ``os.PathLike`` or binary file object.
        ValueError: an unsupported dtype, two arrays with the same tensor key, an array at the
            tensor key ``__metadata__`` (safetensors' header), or a state that contains itself.
        FileNotFoundError / IsADirectoryError: the folder does not exist / ``path`` is a folder.
        OSError: ``path`` is (or links to) something other than a regular file, such as a
            device or a FIFO; or writing failed (disk full ...): the previous file at ``path``
            is untouched and the temporary file is removed.
    """
    target = None if _is_file(f, "write") else _target(f, or_file=True)
    tensors, paths = {}, {}
    tree = _encode(obj, (), tensors, paths, set())
    tree_json = json.dumps(tree, allow_nan=False, separators=(",", ":"))
    metadata = {_FORMAT_KEY: FORMAT_VERSION, _TREE_KEY: tree_json,
                _TREE_HASH_KEY: hashlib.sha256(tree_json.encode()).hexdigest()}
    data = _canonical(safetensors.numpy.save(tensors, metadata=metadata))
    if target is not None:
        _write_atomic(target, data)
        return
    try:
        f.write(data)
    except TypeError:
        raise TypeError(f"miniflow.save: {_file_name(f)!r} takes text, not bytes; open the file "
                        f"in binary mode ('wb') or give an io.BytesIO") from None


def _is_file(f, method: str) -> bool:
    """Whether ``f`` is a file object (has a callable ``method``: ``read`` or ``write``)."""
    return callable(getattr(f, method, None))


def _file_name(f) -> str:
    """A file object's name for messages: its ``name`` if a str, else ``<BytesIO>`` ..."""
    name = getattr(f, "name", None)
    return name if isinstance(name, str) else f"<{type(f).__name__}>"


def _canonical(data: bytes) -> bytes:
    """``data`` (a safetensors file) with its metadata keys in sorted order, so that one state
    saves to the same bytes in every process. safetensors (0.8.0 and earlier) writes the metadata
    from a Rust ``HashMap`` in its randomly seeded order (safetensors issue 584): the same state
    saved twice differed in the order of the three keys, and so in every file checksum. The
    tensor entries keep safetensors' order (that of their data); the header is padded with spaces
    to a multiple of 8 bytes, as safetensors pads it."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps({"__metadata__": header.pop("__metadata__"), **header},
                      ensure_ascii=False, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + data[8 + n:]


def _fs_path(path, owner: str, or_file: bool = False) -> str:
    """``path`` (a str, bytes or ``os.PathLike``, as ``open`` takes) as a str
    (``os.fsdecode``), so that every message and later path operation sees one type.

    Raises:
        TypeError: ``path`` is none of those (naming ``owner``, the function given it; and
            that a binary file object is taken too where ``or_file``).
    """
    try:
        return os.fsdecode(path)
    except TypeError:
        files = " or a binary file object (io.BytesIO)" if or_file else ""
        raise TypeError(f"{owner}: the path must be a str, bytes or os.PathLike (as open() "
                        f"takes){files}, got {type(path).__name__}") from None


def _target(path, owner: str = "miniflow.save", what: str = "a checkpoint",
            or_file: bool = False) -> str:
    """The file :func:`save` replaces for ``path``: its symlinks resolved (``os.path.realpath``).
    The errors name ``owner`` (the function writing) and ``what`` it writes.

    Raises:
        FileNotFoundError: its folder does not exist. NotADirectoryError: its "folder" is a
            file. IsADirectoryError: it is a folder.
        OSError: it is something else than a regular file (a device, a FIFO, a socket), or a
            symlink loop (ELOOP).
    """
    path = _fs_path(path, owner, or_file)
    target = os.path.realpath(path)
    shown = repr(path) if target == os.path.abspath(path) else f"{path!r} (-> {target!r})"
    folder = os.path.dirname(target)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise NotADirectoryError(f"{owner}: {folder!r} in {shown} is a file, not a folder; "
                                 "give a path in a folder")
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{owner}: the folder {folder!r} of {shown} does not "
                                "exist; create it first (os.makedirs)")
    try:
        mode = os.stat(target).st_mode  # a symlink loop raises OSError (ELOOP) here
    except FileNotFoundError:
        return target
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(f"{owner}: {shown} is a folder; give a file name")
    if not stat.S_ISREG(mode):
        kind = {stat.S_IFCHR: "character device", stat.S_IFBLK: "block device",
                stat.S_IFIFO: "FIFO", stat.S_IFSOCK: "socket"}.get(stat.S_IFMT(mode), "special file")
        raise OSError(f"{owner}: {shown} is a {kind}, not a regular file; {what} replaces a "
                      "regular file or creates a new one: give another path")
    return target


def check_save_path(path, owner: str = "miniflow.save", what: str = "a checkpoint") -> str:
    """Check, before a long job, that :func:`save` (or :func:`write_atomic`) can write ``path``:
    the checks ``save`` makes (folder exists, not a folder, not a device, FIFO or socket) and a
    temporary file created and removed in the target's folder. Returns the target (symlinks
    resolved); writes nothing.

    Raises:
        FileNotFoundError, IsADirectoryError, OSError: as :func:`save`; PermissionError (or
            another OSError: a read-only file system): the folder is not writable, naming it.
    """
    target = _target(path, owner, what)
    folder = os.path.dirname(target)
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:    # it named the temporary file ('/ro/tmpk2x9'), not the user's path
        raise type(e)(f"{owner}: cannot write {what} in the folder {folder!r}: "
                      f"{e.strerror or e}; give a path in a writable folder") from None
    return target


def _where(keys: tuple) -> str:
    """``state['model'][0]``: the place of a value in the state, for error messages."""
    return "state" + "".join(f"[{k!r}]" for k in keys)


def _encode(value, keys: tuple, tensors: dict, paths: dict, active: set):
    """The JSON tree of ``value`` (at ``keys`` in the state); arrays go into ``tensors``."""
    if isinstance(value, (np.ndarray, np.generic)):
        return _encode_array(value, keys, tensors, paths)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, (dict, list, tuple)):
        if id(value) in active:
            raise ValueError(f"miniflow.save: {_where(keys)} contains itself; a checkpoint "
                             "must be a tree")
        active.add(id(value))
        if isinstance(value, dict):
            node = {"dict": [[_key(k, keys), _encode(v, keys + (k,), tensors, paths, active)]
                             for k, v in value.items()]}
        else:
            node = {"tuple" if isinstance(value, tuple) else "list":
                    [_encode(v, keys + (i,), tensors, paths, active) for i, v in enumerate(value)]}
        active.discard(id(value))
        return node
    hint = (" (a Tensor? save its array: t.numpy(); state_dict() methods return arrays)"
            if callable(getattr(value, "numpy", None)) else "")
    raise TypeError(f"miniflow.save: {_where(keys)} is a {type(value).__module__}."
                    f"{type(value).__qualname__}{hint}; a checkpoint holds dicts, lists, tuples, "
                    "NumPy arrays and scalars, None, bool, int, float and str")


def _key(key, keys: tuple):
    """A dict key as stored in the tree: str (one UTF-8 can write: an array under a key with a
    lone surrogate half would be a tensor name safetensors cannot write), or int (NumPy integers
    become int)."""
    if isinstance(key, str):
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"miniflow.save: {_where(keys)} has the key {key!r}, which UTF-8 "
                             "cannot encode (a lone surrogate); use a key of valid Unicode") \
                from None
        return key
    if is_integer(key):
        return int(key)
    raise TypeError(f"miniflow.save: {_where(keys)} has the key {key!r} of type "
                    f"{type(key).__name__}; dict keys must be str or int")


def _encode_array(value, keys: tuple, tensors: dict, paths: dict) -> dict:
    if isinstance(value, np.ma.MaskedArray):
        raise TypeError(f"miniflow.save: {_where(keys)} is a masked array; its mask would be "
                        "lost: save .data and .mask as two arrays")
    a = np.asarray(value, order="C")  # safetensors reads the raw buffer: it must be C order
    if a.dtype.name not in _DTYPES:
        raise ValueError(f"miniflow.save: {_where(keys)} has dtype {a.dtype}; a checkpoint "
                         f"stores {', '.join(_DTYPES)}")
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    key = ".".join(str(k) for k in keys)
    if key == "__metadata__":       # safetensors' header entry of that name is not a tensor
        raise ValueError(f"miniflow.save: {_where(keys)} would be stored under the tensor key "
                         "'__metadata__', which safetensors reserves for its header; rename "
                         "the key")
    if key in tensors:
        raise ValueError(f"miniflow.save: {_where(paths[key])} and {_where(keys)} would both be "
                         f"stored under the tensor key {key!r}; rename one of the keys")
    tensors[key], paths[key] = a, keys
    node = {"tensor": key, "dtype": a.dtype.name, "shape": list(a.shape), "sha256": _digest(a)}
    if isinstance(value, np.generic):
        node["scalar"] = True
    return node


def _digest(a: np.ndarray) -> str:
    """SHA-256 of a C-contiguous array's bytes."""
    return hashlib.sha256(a.reshape(-1).view(np.uint8)).hexdigest()


def write_atomic(path, data: bytes, owner: str, what: str) -> str:
    """Write ``data`` (bytes) to ``path`` as :func:`save` writes a checkpoint: a symlink written
    through, a folder, device, FIFO or socket refused (errors naming ``owner`` and ``what``
    it writes), atomically (the old file or the new one, never a part), a replaced file's
    permission bits kept. Returns the file written (symlinks resolved).

    Raises:
        FileNotFoundError, IsADirectoryError, OSError: as :func:`save`."""
    target = _target(path, owner, what)
    _write_atomic(target, data)
    return target


def _write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to a new temporary file beside ``path``, fsync it, rename it over ``path``
    (``os.replace``: atomic on POSIX and Windows), fsync the folder so the rename is durable. A
    file replaced passes its permission bits on."""
    folder, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        try:
            try:
                os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
            except FileNotFoundError:
                pass
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view[:_CHUNK]):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if os.name == "posix":  # a folder cannot be opened for fsync on Windows
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


# ---------------------------------------------------------------------------------------- load
def _folder_message(path: str) -> str:
    """:func:`load`'s error for a folder ``path``: the checkpoint files in it, if any."""
    try:
        names = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    except OSError:
        names = []
    if not names:
        return (f"miniflow.load: {path!r} is a folder, not a checkpoint file; give the path of "
                "a file miniflow.save wrote")
    return (f"miniflow.load: {path!r} is a folder, not a checkpoint file; it holds "
            f"{', '.join(names[:3])}{' ...' if len(names) > 3 else ''}: load "
            f"{os.path.join(path, names[0])!r}")


def load(f, map_location=None, pickle_module=None, *, weights_only=None):
    """Read a checkpoint written by :func:`save`: a new object equal to the saved state (dicts as
    ``dict`` with their key types and order, lists, tuples, bit-identical writable NumPy arrays,
    NumPy scalars, Python scalars). Every checksum is verified before anything is returned.
    ``torch.load``'s arguments (nanoGPT's ``torch.load(ckpt_path, map_location=device)``):

    Args:
        f: the file (str, bytes or ``os.PathLike``), or a binary file object (``io.BytesIO``,
            a file opened ``"rb"``), read from its position to its end.
        map_location: None or a device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, a ``torch.device``
            or ``miniflow.device``. A checkpoint holds NumPy arrays (host memory); the tensors
            made of them live on the process's backend whatever the device, so any such device
            is taken and changes nothing.
        pickle_module: None only (nothing is pickled).
        weights_only: None, True or False, all safe: miniflow's format is safetensors and JSON,
            and loading never runs code (PyTorch's True restricts unpickling; there is none).

    Raises:
        TypeError: ``f`` is no str, bytes, ``os.PathLike`` or binary file object; a
            ``map_location`` that is a dict or a function (PyTorch's remapping; there is
            nothing to remap) or not a device; ``weights_only`` not None or a bool.
        ValueError: a ``pickle_module``; a ``map_location`` string that names no device.
        FileNotFoundError: no such file.
        IsADirectoryError: ``path`` is a folder (a ``miniflow train --checkpoint`` folder:
            naming the ``.safetensors`` files in it to load instead).
        CheckpointError (a ValueError): not a safetensors file; a safetensors file that
            :func:`save` did not write (e.g. a plain PyTorch one: read it with
            ``safetensors.numpy.load_file``); a format version this code does not know; a
            truncated file (naming the first incomplete tensor); an edited file (naming the
            tensor key, or the tree); each message names the file.
    """
    _check_load_options(map_location, pickle_module, weights_only)
    if _is_file(f, "read"):
        path, data = _file_name(f), f.read()
        if not isinstance(data, bytes):
            raise TypeError(f"miniflow.load: {path!r} gives text, not bytes; open the file in "
                            f"binary mode ('rb')")
    else:
        path = _fs_path(f, "miniflow.load", or_file=True)
        if os.path.isdir(path):
            raise IsADirectoryError(_folder_message(path))
        with open(path, "rb") as file:
            data = file.read()
    header, start = _read_header(path, data)
    metadata = header.pop("__metadata__", None) or {}
    if _FORMAT_KEY not in metadata:
        names = sorted(header)[:4]
        raise CheckpointError(f"miniflow.load: {path!r} is a safetensors file but not a miniflow "
                              f"checkpoint (no {_FORMAT_KEY!r} metadata; tensors {names}"
                              f"{' ...' if len(header) > 4 else ''}); read plain safetensors "
                              "files with safetensors.numpy.load_file")
    if metadata[_FORMAT_KEY] != FORMAT_VERSION:
        raise CheckpointError(f"miniflow.load: {path!r} has checkpoint format "
                              f"{metadata[_FORMAT_KEY]!r}; this miniflow reads format "
                              f"{FORMAT_VERSION!r} (written by a newer miniflow?)")
    tree_json = metadata.get(_TREE_KEY, "")
    if hashlib.sha256(tree_json.encode()).hexdigest() != metadata.get(_TREE_HASH_KEY):
        raise CheckpointError(f"miniflow.load: {path!r} is corrupted: the checksum of its "
                              f"structure ({_TREE_KEY!r}, the non-array values) does not match")
    _check_size(path, header, start, len(data))
    try:
        arrays = {key: np.frombuffer(t["data"], _np_dtype(t["dtype"])).reshape(t["shape"])
                  for key, t in safetensors.deserialize(data)}
    except safetensors.SafetensorError as e:
        raise CheckpointError(f"miniflow.load: {path!r} is corrupted: {e}") from None
    unused = dict(arrays)
    state = _decode(json.loads(tree_json), arrays, unused, path)
    if unused:
        raise CheckpointError(f"miniflow.load: {path!r} is corrupted: tensors {sorted(unused)} "
                              "are not part of the saved state")
    return state


def _check_load_options(map_location, pickle_module, weights_only) -> None:
    """:func:`load`'s PyTorch arguments: a device or None, no pickle module, a bool or None.

    Raises:
        TypeError / ValueError: as :func:`load` documents them."""
    if isinstance(map_location, dict) or callable(map_location):
        raise TypeError(f"miniflow.load: map_location as a {type(map_location).__name__} (a "
                        f"remapping of storages) is not supported: a checkpoint holds NumPy "
                        f"arrays, which tensors take on the process's backend; give None or "
                        f"a device such as 'cpu'")
    if map_location is not None:
        kind, _, index = str(map_location).partition(":")
        if not (isinstance(map_location, str) or type(map_location).__name__ == "device"):
            raise TypeError(f"miniflow.load: map_location must be None or a device ('cpu', "
                            f"'cuda', a torch.device), got {type(map_location).__name__}")
        if kind not in ("cpu", "cuda") or not (index == "" or index.isdigit()):
            raise ValueError(f"miniflow.load: map_location={map_location!r} is not a device "
                             f"miniflow knows; give None, 'cpu' or 'cuda' (it changes nothing: "
                             f"the arrays load on the host)")
    if pickle_module is not None:
        raise ValueError(f"miniflow.load: pickle_module={pickle_module!r}: a miniflow "
                         f"checkpoint is safetensors and JSON, nothing is unpickled; leave "
                         f"it out")
    if weights_only is not None and not isinstance(weights_only, bool):
        raise TypeError(f"miniflow.load: weights_only must be None, True or False, got "
                        f"{weights_only!r}")


_SAFETENSORS_DTYPES = {"BOOL": np.bool_, "I8": np.int8, "U8": np.uint8, "I16": np.int16,
                       "U16": np.uint16, "I32": np.int32, "U32": np.uint32, "I64": np.int64,
                       "U64": np.uint64, "F16": np.float16, "F32": np.float32,
                       "F64": np.float64, "C64": np.complex64}
"""safetensors dtype name -> NumPy dtype, for :data:`_DTYPES` but ``BF16`` (``bfloat16.np``, which
imports ``ml_dtypes``: :func:`_np_dtype`); safetensors' NumPy API reads no ``BF16``, so :func:`load`
maps the names itself."""


def _np_dtype(name: str):
    """The NumPy dtype of a safetensors dtype name (``F32``, ``BF16`` ...).

    Raises:
        safetensors.SafetensorError: a dtype a checkpoint never holds (F8_E4M3 ...).
    """
    if name == "BF16":
        return bfloat16.np
    if name not in _SAFETENSORS_DTYPES:
        raise safetensors.SafetensorError(f"tensor dtype {name} is not one miniflow.save writes")
    return _SAFETENSORS_DTYPES[name]


def _read_header(path: str, data: bytes) -> tuple:
    """The safetensors JSON header of ``data`` (an 8-byte little-endian length, then JSON) and
    where the tensor data starts."""
    if len(data) < 10:
        raise CheckpointError(f"miniflow.load: {path!r} has {len(data)} bytes: too short for a "
                              "checkpoint (truncated, or not written by miniflow.save)")
    n = int.from_bytes(data[:8], "little")
    if all(32 <= b < 127 for b in data[:8]):    # a header's length has zero high bytes
        raise CheckpointError(f"miniflow.load: {path!r} is not a safetensors file: it starts "
                              f"with text ({data[:16]!r}), where one starts with the length of "
                              "its header (was it written by miniflow.save?)")
    if data[8:9] == b"{" and 8 + n > len(data):
        raise CheckpointError(f"miniflow.load: {path!r} is truncated: {len(data)} bytes, but "
                              f"its header alone needs {8 + n}")
    try:
        if n < 2 or data[8:9] != b"{":
            raise ValueError("no safetensors header")
        header = json.loads(data[8:8 + n])
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
    except ValueError:  # includes json.JSONDecodeError and UnicodeDecodeError
        raise CheckpointError(f"miniflow.load: {path!r} is not a safetensors file (miniflow "
                              "checkpoints are written by miniflow.save)") from None
    return header, 8 + n


def _check_size(path: str, header: dict, start: int, size: int) -> None:
    """Raise if the file is shorter (truncated) or longer than its header says (tensor data
    from byte ``start``)."""
    try:
        ends = sorted((info["data_offsets"][1], key) for key, info in header.items())
    except (KeyError, IndexError, TypeError):
        raise CheckpointError(f"miniflow.load: {path!r} is corrupted: its safetensors header "
                              "has an entry without data offsets") from None
    need = start + (ends[-1][0] if ends else 0)
    if size < need:
        cut = next(key for end, key in ends if start + end > size)
        raise CheckpointError(f"miniflow.load: {path!r} is truncated: {size} bytes of {need}; "
                              f"tensor {cut!r} is incomplete")
    if size > need:
        raise CheckpointError(f"miniflow.load: {path!r} is corrupted: {size - need} bytes "
                              "after the last tensor")


def _decode(node, arrays: dict, unused: dict, path: str):
    """The value of a JSON tree node (the inverse of :func:`_encode`)."""
    if not isinstance(node, (dict, list)):
        return node
    if isinstance(node, dict) and "tensor" in node:
        return _decode_array(node, arrays, unused, path)
    kind, body = (next(iter(node.items())) if isinstance(node, dict) and len(node) == 1
                  else (None, None))
    if kind not in ("float", "dict", "list", "tuple"):
        raise CheckpointError(f"miniflow.load: {path!r} is corrupted: unexpected node "
                              f"{json.dumps(node)[:80]} in its structure")
    if kind == "float":
        return float(body)
    if kind == "dict":
        return {k: _decode(v, arrays, unused, path) for k, v in body}
    items = [_decode(v, arrays, unused, path) for v in body]
    return tuple(items) if kind == "tuple" else items


def _decode_array(node: dict, arrays: dict, unused: dict, path: str):
    key = node["tensor"]
    if key not in unused:
        raise CheckpointError(f"miniflow.load: {path!r} is corrupted: tensor {key!r} is "
                              + ("used twice" if key in arrays else "missing"))
    a = unused.pop(key)
    saved = f"{node['dtype']}{node['shape']}"
    if a.dtype.name != node["dtype"] or list(a.shape) != node["shape"]:
        raise CheckpointError(f"miniflow.load: {path!r} is corrupted: tensor {key!r} is "
                              f"{a.dtype.name}{list(a.shape)} in the file but was saved as {saved}")
    if _digest(a) != node["sha256"]:
        raise CheckpointError(f"miniflow.load: {path!r} is corrupted: the data of tensor {key!r} "
                              f"({saved}) does not match its checksum")
    return a[()] if node.get("scalar") else a
