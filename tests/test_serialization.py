"""Checkpoints: ``save``/``load`` round trips, tensor keys and PyTorch interop, atomic writes under
SIGKILL, and clear errors for truncated, edited and foreign files."""
import io
import json
import math
import os
import pickle
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, OrderedDict

import numpy as np
import pytest
import safetensors.numpy

import miniflow as mf
from miniflow import nn
from miniflow.serialization import CheckpointError, load, save

SERIALIZATION_MODULE = "miniflow.serialization"
"""The module the SIGKILL children import (``miniflow.serialization`` in the repo)."""


# ------------------------------------------------------------------------------------ helpers
def assert_same(saved, loaded, where="state"):
    """``loaded`` is what :func:`load` must return for ``saved``: same types (dict and tuple
    subclasses as dict and tuple), key order and key types, bit-identical arrays."""
    if isinstance(saved, dict):
        assert type(loaded) is dict, where
        assert [(type(k), k) for k in saved] == [(type(k), k) for k in loaded], where
        for k in saved:
            assert_same(saved[k], loaded[k], f"{where}[{k!r}]")
    elif isinstance(saved, (list, tuple)):
        assert type(loaded) is (tuple if isinstance(saved, tuple) else list), where
        assert len(saved) == len(loaded), where
        for i, (a, b) in enumerate(zip(saved, loaded)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(saved, np.ndarray):
        assert type(loaded) is np.ndarray and loaded.flags.writeable, where
        assert loaded.dtype == saved.dtype.newbyteorder("=") and loaded.shape == saved.shape, where
        little = np.ascontiguousarray(saved).astype(saved.dtype.newbyteorder("<"))
        assert loaded.tobytes() == little.tobytes(), where
    elif isinstance(saved, np.generic):
        assert type(loaded) is type(saved) and loaded.tobytes() == saved.tobytes(), where
    elif isinstance(saved, float):
        assert type(loaded) is float, where
        assert (math.isnan(saved) and math.isnan(loaded)) or (
            saved == loaded and math.copysign(1, saved) == math.copysign(1, loaded)), where
    else:
        assert type(loaded) is type(saved) and loaded == saved, where


def round_trip(state, tmp_path, name="ckpt.safetensors"):
    path = tmp_path / name
    save(state, path)
    return load(path)


def header_of(data: bytes) -> dict:
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n]), 8 + n


# --------------------------------------------------------------------------------- round trips
def test_round_trip_of_every_value_type_and_nesting(tmp_path):
    rng = np.random.default_rng(0)
    state = {
        "arrays": {dt: (rng.standard_normal((2, 3)) * 100).astype(dt)
                   for dt in ("float16", "float32", "float64", "int8", "uint8", "int16",
                              "uint16", "int32", "uint32", "int64", "uint64")},
        "bool_array": rng.random((4, 1)) < 0.5,
        "complex": (rng.standard_normal(3) + 1j).astype(np.complex64),
        "zero_d": np.array(2.5, np.float32),
        "empty": np.zeros((0, 3), np.float64),
        "numpy_scalars": [np.float32(1.5), np.float64(-0.0), np.int64(-3), np.bool_(True),
                          np.float16(np.inf)],
        "python": [None, True, False, 0, -5, 2 ** 70, 1.0, 0.1, -0.0, 5e-324,
                   1.7976931348623157e308, math.inf, -math.inf, math.nan, "",
                   "unicodé ✓ \n \"quoted\" \ud800"],
        7: "int key", -1: {"nested": ({"deep": [np.arange(3)]}, ())},
        "empty_containers": [{}, [], ()],
        "tuple": (1, (2.0, "three"), [np.ones(2, np.float16)]),
        "ordered": OrderedDict([("z", 1), ("a", 2)]),
        "counter": Counter({30: 2, 10: 1}),
    }
    loaded = round_trip(state, tmp_path)
    assert_same(state, loaded)
    assert type(loaded["numpy_scalars"][0]) is np.float32
    assert loaded["counter"] == {30: 2, 10: 1} and list(loaded["counter"]) == [30, 10]


def test_a_bare_array_and_a_bare_scalar_round_trip(tmp_path):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert_same(a, round_trip(a, tmp_path))
    assert list(safetensors.numpy.load_file(tmp_path / "ckpt.safetensors")) == [""]
    assert_same(42, round_trip(42, tmp_path, "n.safetensors"))


def test_arrays_are_bit_identical_nan_payloads_signed_zeros_subnormals(tmp_path):
    bits32 = np.array([0x7FC00001, 0xFFC12345, 0x80000000, 0x00000001, 0x7F800000, 0x3DCCCCCD],
                      np.uint32)
    bits16 = np.array([0x7E01, 0xFC00, 0x8000, 0x0001, 0x3555], np.uint16)
    state = {"f32": bits32.view(np.float32), "f16": bits16.view(np.float16),
             "f64": np.array([np.nextafter(0, 1), -0.0, np.pi])}
    loaded = round_trip(state, tmp_path)
    assert loaded["f32"].view(np.uint32).tolist() == bits32.tolist()
    assert loaded["f16"].view(np.uint16).tolist() == bits16.tolist()
    assert loaded["f64"].tobytes() == state["f64"].tobytes()
    loaded["f32"][0] = 1.0  # writable, and a copy: the saved array is unchanged
    assert state["f32"].view(np.uint32)[0] == 0x7FC00001


def test_non_contiguous_and_big_endian_arrays_keep_their_values(tmp_path):
    """safetensors reads an array's raw buffer: a transposed view must be made contiguous first
    (without that it stores the untransposed memory)."""
    base = np.arange(12, dtype=np.float64).reshape(3, 4)
    state = {"transposed": base.T, "strided": base[:, ::2], "big_endian": base.astype(">f4"),
             "fortran": np.asfortranarray(base)}
    loaded = round_trip(state, tmp_path)
    for k, v in state.items():
        np.testing.assert_array_equal(loaded[k], v, err_msg=k)
        assert loaded[k].dtype.isnative and loaded[k].flags.c_contiguous
    assert_same(state, loaded)


def test_int_keys_stay_int_str_keys_stay_str_and_bool_is_not_int(tmp_path):
    state = {0: "zero", "0": "string zero", 1: True, "1": 1, "f": 1.0, "b": False, "i": 0}
    loaded = round_trip(state, tmp_path)
    assert_same(state, loaded)
    assert [type(loaded[k]) for k in (1, "1", "f", "b", "i")] == [bool, int, float, bool, int]


def test_optimizer_state_dicts_round_trip_and_load_into_new_optimizers(tmp_path):
    """The PyTorch layout's int keys (``state[0]``) and Adam's betas tuple survive."""
    mf.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    rng = np.random.default_rng(1)
    for opt_cls, kw in ((mf.optim.SGD, dict(lr=0.1, momentum=0.9)),
                        (mf.optim.Adam, dict(lr=1e-3, betas=(0.8, 0.99))),
                        (mf.optim.Adadelta, dict(lr=0.5, rho=0.8, maximize=True))):
        opt = opt_cls(model.parameters(), **kw)
        sd = opt.state_dict()
        for i, s in sd["state"].items():  # non-trivial state, as after some steps
            sd["state"][i] = {k: (v + 7 if v.dtype.kind == "i" else
                                  np.abs(rng.standard_normal(v.shape)).astype(v.dtype))
                              for k, v in s.items()}
        opt.load_state_dict(sd)
        loaded = round_trip(opt.state_dict(), tmp_path, f"{opt_cls.__name__}.safetensors")
        assert_same(opt.state_dict(), loaded)
        assert list(loaded["state"]) == [0, 1, 2, 3]
        fresh = opt_cls(model.parameters(), lr=0.5)
        fresh.load_state_dict(loaded)
        assert_same(opt.state_dict(), fresh.state_dict())


def test_training_state_of_real_objects_round_trips(tmp_path):
    mf.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = mf.amp.GradScaler(init_scale=1024.0, growth_interval=10)
    scaler.load_state_dict({**scaler.state_dict(), "_growth_tracker": 3, "found_inf": True,
                            "num_skipped_steps": 2})
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(),
             "grad_scaler": scaler.state_dict(), "step": 100,
             "scheduler": {"step_size": 30, "gamma": 0.1, "base_lrs": [0.1], "last_epoch": 100,
                           "_step_count": 101, "_last_lr": [0.001]}}
    loaded = round_trip(state, tmp_path)
    assert_same(state, loaded)
    mf.manual_seed(5)
    model2 = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    opt2 = mf.optim.SGD(model2.parameters(), lr=0.5)
    scaler2 = mf.amp.GradScaler()
    model2.load_state_dict(loaded["model"])
    opt2.load_state_dict(loaded["optimizer"])
    scaler2.load_state_dict(loaded["grad_scaler"])
    assert_same(state["model"], dict(model2.state_dict()))
    assert_same(state["optimizer"], opt2.state_dict())
    assert scaler2.state_dict() == state["grad_scaler"]


class _Step(nn.Graph):
    def __init__(self, model, opt):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)

    def build(self, x, y):
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        return loss


def _trainer(seed):
    mf.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = mf.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    return model, opt, _Step(model, opt)


def test_resumed_training_is_bit_identical_to_an_uninterrupted_run(tmp_path):
    rng = np.random.default_rng(3)
    data = [(rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 4, 8))
            for _ in range(8)]
    model, opt, step = _trainer(seed=1)
    for x, y in data[:4]:
        step(x, y)
    save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 4},
         tmp_path / "ckpt.safetensors")
    straight = [float(step(x, y)) for x, y in data[4:]]

    model2, opt2, step2 = _trainer(seed=2)  # other initial weights: all must come from the file
    ckpt = load(tmp_path / "ckpt.safetensors")
    model2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["optimizer"])
    resumed = [float(step2(x, y)) for x, y in data[ckpt["step"]:]]
    assert resumed == straight
    assert_same(dict(model.state_dict()), dict(model2.state_dict()))
    assert_same(opt.state_dict(), opt2.state_dict())


# ------------------------------------------------------------------------------- tensor keys
def _mlp(seed=0, hidden=8):
    mf.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 3))


def test_a_model_state_dict_is_stored_under_its_own_keys(tmp_path):
    model = _mlp()
    save(model.state_dict(), tmp_path / "m.safetensors")
    plain = safetensors.numpy.load_file(tmp_path / "m.safetensors")
    assert sorted(plain) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    for k, v in model.state_dict().items():
        assert plain[k].tobytes() == v.tobytes()


def test_one_state_saves_to_the_same_bytes_every_time(tmp_path):
    """safetensors writes its metadata in a per-map random order (a Rust HashMap): eight saves
    of one state gave up to eight different files before save sorted the keys (issue 23:
    `miniflow train --save` looked non-deterministic by its MD5, the weights were identical)."""
    model = _mlp()
    files = set()
    for i in range(8):
        save(model.state_dict(), tmp_path / f"{i}.safetensors")
        files.add((tmp_path / f"{i}.safetensors").read_bytes())
    assert len(files) == 1
    data = files.pop()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    assert n % 8 == 0 and list(header)[0] == "__metadata__"
    assert list(header["__metadata__"]) == sorted(header["__metadata__"])
    plain = safetensors.numpy.load_file(tmp_path / "0.safetensors")
    for k, v in model.state_dict().items():
        assert plain[k].tobytes() == v.tobytes()


def test_a_nested_state_is_stored_under_dotted_paths(tmp_path):
    model = _mlp()
    opt = mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 100,
             "history": [np.zeros(2), {"x": np.ones(1)}]}
    save(state, tmp_path / "c.safetensors")
    assert sorted(safetensors.numpy.load_file(tmp_path / "c.safetensors")) == sorted(
        [f"model.{k}" for k in ("0.weight", "0.bias", "2.weight", "2.bias")]
        + [f"optimizer.state.{i}.momentum_buffer" for i in range(4)]
        + ["history.0", "history.1.x"])


def test_pytorch_loads_a_miniflow_model_file_under_its_state_dict_keys(tmp_path):
    torch = pytest.importorskip("torch")
    import safetensors.torch
    model = _mlp(seed=4)
    save(model.state_dict(), tmp_path / "m.safetensors")
    tensors = safetensors.torch.load_file(tmp_path / "m.safetensors")
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    assert sorted(tensors) == sorted(ref.state_dict()) == ["0.bias", "0.weight", "2.bias",
                                                          "2.weight"]
    ref.load_state_dict(tensors, strict=True)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    w = {k: v.astype(np.float64) for k, v in model.state_dict().items()}
    expected = np.maximum(x @ w["0.weight"].T + w["0.bias"], 0) @ w["2.weight"].T + w["2.bias"]
    with torch.no_grad():
        got = ref(torch.from_numpy(x)).double().numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- save errors
class _Thing:
    pass


class _FakeTensor:
    def numpy(self):
        return np.zeros(1)


def _self_containing():
    d = {"a": [1]}
    d["a"].append(d)
    return d


@pytest.mark.parametrize("state, error, match", [
    ({"a": {1, 2}}, TypeError, r"state\['a'\] is a builtins.set"),
    ({"m": [0, _Thing()]}, TypeError, r"state\['m'\]\[1\] is a .*_Thing"),
    ({"w": _FakeTensor()}, TypeError, r"a Tensor\? save its array: t.numpy\(\)"),
    ({(1, 2): np.ones(1)}, TypeError, r"key \(1, 2\) of type tuple; dict keys must be str or int"),
    ({"x": {1.5: 0}}, TypeError, r"state\['x'\] has the key 1.5"),
    ({True: 0}, TypeError, r"key True of type bool"),
    ({"o": np.array([object()])}, ValueError, r"state\['o'\] has dtype object"),
    ({"c": np.ones(2, np.complex128)}, ValueError, r"dtype complex128; a checkpoint stores"),
    ({"s": np.array(["ab"])}, ValueError, r"has dtype <U2"),
    ({"ma": np.ma.masked_array([1.0, 2.0], [0, 1])}, TypeError, r"masked array"),
    ({"a.b": np.ones(1), "a": {"b": np.zeros(1)}}, ValueError,
     r"state\['a.b'\] and state\['a'\]\['b'\] would both be stored under the tensor key 'a.b'"),
    ({0: np.ones(1), "0": np.ones(1)}, ValueError, r"tensor key '0'"),
    (_self_containing(), ValueError, r"state\['a'\]\[1\] contains itself"),
])
def test_save_refuses_unsupported_state_and_writes_nothing(tmp_path, state, error, match):
    with pytest.raises(error, match=match):
        save(state, tmp_path / "x.safetensors")
    assert os.listdir(tmp_path) == []


def test_save_refuses_a_missing_folder_and_a_folder_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"folder .*nope.* does not exist"):
        save({}, tmp_path / "nope" / "x.safetensors")
    with pytest.raises(IsADirectoryError, match="is a folder"):
        save({}, tmp_path)


def test_load_of_a_folder_names_it_and_the_checkpoints_in_it(tmp_path):
    """``load("ck")`` of a ``miniflow train --checkpoint ck`` folder (the run's folder, not its
    file) was a bare "[Errno 21] Is a directory: 'ck'"; the error names the folder, as save's
    does, and the checkpoint files in it to load instead (a folder without one: what to give)."""
    save({"a": np.ones(2)}, tmp_path / "checkpoint.safetensors")
    (tmp_path / "losses.csv").write_text("step,loss\n")
    want = re.escape(repr(str(tmp_path / "checkpoint.safetensors")))
    with pytest.raises(IsADirectoryError, match=rf"miniflow.load: .* is a folder, not a "
                                                rf"checkpoint file; it holds "
                                                rf"checkpoint.safetensors: load {want}"):
        load(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(IsADirectoryError, match=r"is a folder, not a checkpoint file; give the "
                                                r"path of a file miniflow.save wrote"):
        load(empty)


def test_a_path_under_a_file_is_refused_naming_the_file(tmp_path):
    """``save(sd, "notes.txt/model.safetensors")`` said the folder 'notes.txt' "does not exist;
    create it first", which os.makedirs cannot: it is a file. ``--save`` and ``ir --onnx``
    check their paths this way too."""
    from miniflow.serialization import check_save_path
    (tmp_path / "notes.txt").write_text("notes")
    for write in (lambda p: save({}, p), check_save_path):
        with pytest.raises(NotADirectoryError, match=r"'[^']*notes.txt' in '[^']*notes.txt/m.st'"
                                                     r" is a file, not a folder; give a path in"):
            write(str(tmp_path / "notes.txt" / "m.st"))
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]


def test_a_folder_that_cannot_be_written_is_named_not_a_temporary_file(tmp_path, monkeypatch):
    """check_save_path (``--save``, ``ir --onnx``) in a folder it cannot write said
    ``[Errno 13] Permission denied: '<folder>/tmpk2x9a'``, the name of its own probe file;
    it names the folder and what to do."""
    import tempfile

    from miniflow.serialization import check_save_path

    def refuse(dir=None):
        raise PermissionError(13, "Permission denied", os.path.join(dir, "tmpk2x9a"))

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    with pytest.raises(PermissionError) as e:
        check_save_path(tmp_path / "m.safetensors")
    assert str(e.value) == (f"miniflow.save: cannot write a checkpoint in the folder "
                            f"{str(tmp_path)!r}: Permission denied; give a path in a writable "
                            "folder")


def test_load_takes_torch_loads_map_location_and_weights_only(tmp_path):
    """nanoGPT's ``torch.load(ckpt_path, map_location=device)`` and ``weights_only=True`` were
    a TypeError: a device (or None) is taken and changes nothing (the arrays are host memory),
    ``weights_only`` any bool (nothing is unpickled); a remapping dict or function, a pickle
    module and a string that names no device are refused saying what to give."""
    state = {"w": np.arange(3.0), "step": 2}
    save(state, tmp_path / "c.safetensors")
    for device in (None, "cpu", "cuda", "cuda:1", mf.device("cpu")):
        for weights_only in (None, True, False):
            got = load(tmp_path / "c.safetensors", map_location=device, weights_only=weights_only)
            np.testing.assert_array_equal(got["w"], state["w"])
    assert load(tmp_path / "c.safetensors", "cpu")["step"] == 2
    with pytest.raises(TypeError, match=r"miniflow.load: map_location as a dict .*give None or "
                                        r"a device such as 'cpu'"):
        load(tmp_path / "c.safetensors", {"cuda:0": "cpu"})
    with pytest.raises(TypeError, match=r"map_location as a function"):
        load(tmp_path / "c.safetensors", lambda storage, loc: storage)
    with pytest.raises(ValueError, match=r"map_location='gpu' is not a device miniflow knows"):
        load(tmp_path / "c.safetensors", "gpu")
    with pytest.raises(TypeError, match=r"map_location must be None or a device .*got int"):
        load(tmp_path / "c.safetensors", 0)
    with pytest.raises(ValueError, match=r"pickle_module=.*nothing is unpickled"):
        load(tmp_path / "c.safetensors", None, pickle)
    with pytest.raises(TypeError, match=r"weights_only must be None, True or False, got 'yes'"):
        load(tmp_path / "c.safetensors", weights_only="yes")
    torch = pytest.importorskip("torch")
    np.testing.assert_array_equal(
        load(tmp_path / "c.safetensors", map_location=torch.device("cpu"))["w"], state["w"])


def test_save_and_load_take_binary_file_objects(tmp_path):
    """``mf.save(obj, io.BytesIO())`` said "the path must be a str": a binary file object is
    written with the checkpoint's bytes (the same bytes as a file's) and read back from its
    position, its name in the errors; a text-mode file is refused saying to open it 'wb' / 'rb'."""
    state = {"model": {"w": np.arange(6.0, dtype=np.float32).reshape(2, 3)}, "iter_num": 7}
    buffer = io.BytesIO()
    save(state, buffer)
    save(state, tmp_path / "d.safetensors")
    assert buffer.getvalue() == (tmp_path / "d.safetensors").read_bytes()
    buffer.seek(0)
    got = load(buffer)
    np.testing.assert_array_equal(got["model"]["w"], state["model"]["w"])
    assert got["iter_num"] == 7
    with open(tmp_path / "e.safetensors", "wb") as f:
        save(state, f)
    with open(tmp_path / "e.safetensors", "rb") as f:
        assert load(f, map_location="cpu")["iter_num"] == 7
    with pytest.raises(CheckpointError, match=r"miniflow.load: '<BytesIO>' is"):
        load(io.BytesIO(b"not a checkpoint"))
    with open(tmp_path / "t.txt", "w") as f, pytest.raises(
            TypeError, match=r"miniflow.save: '.*t.txt' takes text, not bytes; open the file in "
                             r"binary mode \('wb'\)"):
        save(state, f)
    with pytest.raises(TypeError, match=r"miniflow.load: '<StringIO>' gives text, not bytes"):
        load(io.StringIO("x"))


def test_a_path_may_be_str_bytes_or_pathlike_and_nothing_else(tmp_path):
    """As ``open`` (and so ``torch.save``/``torch.load``) takes them: a bytes path works (it gave
    ``TypeError: Can't mix strings and bytes`` from deep in ``os.path``); another type is
    refused by name before anything is written."""
    state = {"w": np.arange(3.0)}
    save(state, os.fsencode(tmp_path / "b.safetensors"))
    np.testing.assert_array_equal(load(os.fsencode(tmp_path / "b.safetensors"))["w"], state["w"])
    np.testing.assert_array_equal(load(str(tmp_path / "b.safetensors"))["w"], state["w"])
    for bad in (3, None, ["x"]):
        with pytest.raises(TypeError, match=r"miniflow.save: the path must be a str, bytes or "
                                            r"os.PathLike .*or a binary file object "
                                            rf"\(io.BytesIO\), got {type(bad).__name__}"):
            save(state, bad)
        with pytest.raises(TypeError, match=r"miniflow.load: the path must be"):
            load(bad)
    assert os.listdir(tmp_path) == ["b.safetensors"]


@pytest.mark.skipif(not hasattr(os, "symlink") or os.name != "posix", reason="symlinks")
def test_save_writes_through_a_symlink_and_keeps_the_link(tmp_path):
    """``torch.save(obj, link)`` opens the link for writing: the file it points to gets the
    data, the link stays a link (a dangling one creates its target). The replaced file keeps
    its permission bits. (Before: the link was replaced by a regular file, the target kept its
    old data.)"""
    target, link = tmp_path / "real.safetensors", tmp_path / "link.safetensors"
    save({"k": 1}, target)
    os.chmod(target, 0o640)
    os.symlink(target, link)
    save({"k": 2}, link)
    assert os.path.islink(link) and load(target) == {"k": 2}
    assert os.stat(target).st_mode & 0o777 == 0o640
    dangling = tmp_path / "to-be.safetensors"
    os.symlink(dangling, tmp_path / "dangling")
    save({"k": 3}, tmp_path / "dangling")
    assert os.path.islink(tmp_path / "dangling") and load(dangling) == {"k": 3}
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs")
@pytest.mark.parametrize("through_a_link", [False, True])
def test_save_refuses_what_is_not_a_regular_file_and_leaves_it(tmp_path, through_a_link):
    """A FIFO stands for any non-regular file (``/dev/full`` as root was replaced by a regular
    file): refused before anything is written, naming what it is; the FIFO stays a FIFO.
    ``check_save_path`` (the CLI's check before training) refuses it the same way."""
    import stat
    from miniflow.serialization import check_save_path
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    path = tmp_path / "link" if through_a_link else fifo
    if through_a_link:
        os.symlink(fifo, path)
    for write in (lambda: save({"w": np.ones(3)}, path), lambda: check_save_path(path)):
        with pytest.raises(OSError, match=r"is a FIFO, not a regular file"):
            write()
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(os.listdir(tmp_path)) == sorted({"fifo", path.name})


def test_check_save_path_checks_the_folder_and_writes_nothing(tmp_path):
    from miniflow.serialization import check_save_path
    assert check_save_path(tmp_path / "m.safetensors") == os.path.realpath(
        tmp_path / "m.safetensors")
    assert os.listdir(tmp_path) == []
    with pytest.raises(FileNotFoundError, match=r"folder .*nope.* does not exist"):
        check_save_path(tmp_path / "nope" / "m.safetensors")
    with pytest.raises(IsADirectoryError, match="is a folder"):
        check_save_path(tmp_path)


def test_bfloat16_arrays_round_trip_bit_exact_as_safetensors_bf16(tmp_path):
    """Every one of the 65,536 bfloat16 bit patterns (NaN payloads, signed zeros, subnormals)
    loads back bit for bit; the file's dtype is safetensors ``BF16``, as
    ``safetensors.torch.save_file`` writes ``torch.bfloat16`` tensors."""
    import ml_dtypes
    every = np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16).reshape(256, 256)
    state = {"w": every, "t": every[::3, ::7].T, "s": every[1, 2]}
    loaded = round_trip(state, tmp_path)
    assert_same(state, loaded)
    assert loaded["w"].dtype == ml_dtypes.bfloat16
    header, _ = header_of((tmp_path / "ckpt.safetensors").read_bytes())
    assert header["w"]["dtype"] == "BF16"


def test_pytorch_reads_a_bfloat16_checkpoint_as_torch_bfloat16(tmp_path):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    import ml_dtypes
    x = np.linspace(-3, 3, 12, dtype=np.float32).astype(ml_dtypes.bfloat16)
    save({"x": x}, tmp_path / "b.safetensors")
    t = st.load_file(str(tmp_path / "b.safetensors"))["x"]
    assert t.dtype == torch.bfloat16
    assert np.array_equal(t.view(torch.int16).numpy().view(np.uint16), x.view(np.uint16))


# ---------------------------------------------------------------------------- load errors
def _checkpoint(tmp_path):
    state = {"model": {"w": np.arange(12, dtype=np.float32).reshape(3, 4),
                       "b": np.ones(3, np.float32)}, "step": 100, "lr": 0.5}
    path = tmp_path / "good.safetensors"
    save(state, path)
    return path.read_bytes()


def _write(tmp_path, data, name="bad.safetensors"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_a_truncated_file_names_the_file_and_the_incomplete_tensor(tmp_path):
    data = _checkpoint(tmp_path)
    header, start = header_of(data)
    spans = {k: (start + v["data_offsets"][0], start + v["data_offsets"][1])
             for k, v in header.items() if k != "__metadata__"}
    cuts = [0, 5, 9, 40, start - 3, *[(b + e) // 2 for b, e in spans.values()], len(data) - 1]
    for cut in cuts:
        path = _write(tmp_path, data[:cut])
        with pytest.raises(CheckpointError) as e:
            load(path)
        msg = str(e.value)
        assert repr(str(path)) in msg and ("truncated" in msg or "too short" in msg), (cut, msg)
        for key, (b, end) in spans.items():
            if b <= cut < end and b != end:
                assert f"tensor {key!r} is incomplete" in msg, (cut, msg)


@pytest.mark.parametrize("key", ["model.w", "model.b"])
def test_an_edited_tensor_byte_names_the_tensor(tmp_path, key):
    data = bytearray(_checkpoint(tmp_path))
    header, start = header_of(bytes(data))
    data[start + header[key]["data_offsets"][0] + 2] ^= 0x10
    path = _write(tmp_path, bytes(data))
    with pytest.raises(CheckpointError, match=rf"{path}.*corrupted: the data of tensor '{key}' "
                                               r"\(float32\[\d.*\]\) does not match its checksum"):
        load(path)


def test_an_edited_value_in_the_structure_is_detected(tmp_path):
    data = _checkpoint(tmp_path)
    assert data.count(b'\\"step\\",100]') == 1
    path = _write(tmp_path, data.replace(b'\\"step\\",100]', b'\\"step\\",900]'))
    with pytest.raises(CheckpointError, match=r"corrupted: the checksum of its structure"):
        load(path)


def test_an_edited_dtype_in_the_header_names_the_tensor(tmp_path):
    data = _checkpoint(tmp_path)
    i = data.index(b'"model.b":{')
    j = data.index(b'"F32"', i)
    path = _write(tmp_path, data[:j] + b'"I32"' + data[j + 5:])
    with pytest.raises(CheckpointError, match=r"tensor 'model.b' is int32\[3\] in the file but "
                                               r"was saved as float32\[3\]"):
        load(path)


def test_bytes_appended_to_a_checkpoint_are_detected(tmp_path):
    path = _write(tmp_path, _checkpoint(tmp_path) + b"\0" * 16)
    with pytest.raises(CheckpointError, match="16 bytes after the last tensor"):
        load(path)


def test_a_plain_safetensors_file_is_not_a_miniflow_checkpoint(tmp_path):
    path = tmp_path / "plain.safetensors"
    safetensors.numpy.save_file({"0.weight": np.ones((2, 2), np.float32)}, path)
    with pytest.raises(CheckpointError, match=r"plain.safetensors' is a safetensors file but not "
                                               r"a miniflow checkpoint .*\['0.weight'\].*"
                                               r"safetensors.numpy.load_file"):
        load(path)


@pytest.mark.parametrize("content", [
    pickle.dumps({"w": np.ones(3)}),
    b"this is a text file, not a checkpoint at all\n" * 3,
    b"\x93NUMPY\x01\x00v\x00{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }" + b" " * 60,
    b"\xff" * 64,
])
def test_a_file_that_is_not_safetensors_is_refused(tmp_path, content):
    path = _write(tmp_path, content, "other.bin")
    with pytest.raises(CheckpointError, match=r"other.bin' is not a safetensors file"):
        load(path)


def test_a_newer_format_version_is_refused(tmp_path):
    path = tmp_path / "v2.safetensors"
    path.write_bytes(safetensors.numpy.save({}, metadata={"miniflow.checkpoint": "2"}))
    with pytest.raises(CheckpointError, match=r"checkpoint format '2'; this miniflow reads "
                                               r"format '1'"):
        load(path)


def test_a_checkpoint_of_another_model_leaves_the_model_unchanged(tmp_path):
    save(_mlp(seed=1, hidden=8).state_dict(), tmp_path / "a.safetensors")
    other = _mlp(seed=2, hidden=6)
    before = {k: v.copy() for k, v in other.state_dict().items()}
    with pytest.raises(ValueError, match=r"'0.weight' is f32\[6, 4\] in the model but "
                                         r"float32\[8, 4\] in the state dict"):
        other.load_state_dict(load(tmp_path / "a.safetensors"))
    bigger = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3), nn.ReLU(), nn.Linear(3, 2))
    with pytest.raises(KeyError, match=r"missing keys \['4.weight', '4.bias'\]"):
        bigger.load_state_dict(load(tmp_path / "a.safetensors"))
    save({"model": _mlp(seed=1).state_dict(), "step": 3}, tmp_path / "nested.safetensors")
    with pytest.raises(KeyError, match=r"unexpected keys \['model', 'step'\]"):
        other.load_state_dict(load(tmp_path / "nested.safetensors"))
    assert_same(before, dict(other.state_dict()))


# ------------------------------------------------------------------------------ atomicity
def test_a_successful_save_replaces_the_file_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    for k in range(3):
        save({"w": np.full(1000, k, np.float32), "k": k}, path)
        assert os.listdir(tmp_path) == ["ckpt.safetensors"]
        assert load(path)["k"] == k


def test_a_failing_write_keeps_the_previous_file_and_removes_its_temporary_file(
        tmp_path, monkeypatch):
    path = tmp_path / "ckpt.safetensors"
    save({"k": 1}, path)
    old = path.read_bytes()

    def disk_full(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        save({"k": 2, "w": np.ones(10 ** 5)}, path)
    assert os.listdir(tmp_path) == ["ckpt.safetensors"] and path.read_bytes() == old


_CHILD_STATE = """
import numpy as np
def big_state(k):
    return {"model": {"w": np.full(1 << 19, k, np.float32), "b": np.arange(1000.0) * k},
            "step": int(k)}
"""
"""A 2 MiB state; both the test and its child processes build it from this source."""


def _big_state(k):
    ns = {}
    exec(_CHILD_STATE, ns)
    return ns["big_state"](k)


def _child(body: str) -> subprocess.Popen:
    """A Python child that imports the serialization module as ``S`` and runs ``body``."""
    code = f"import os, sys, time\nimport {SERIALIZATION_MODULE} as S\n{_CHILD_STATE}\n{body}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if os.path.isdir(p)))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env)
    watchdog = threading.Timer(120, proc.kill)  # a hung child fails the test, not the run
    watchdog.daemon = True
    watchdog.start()
    return proc


def _temp_files(folder) -> list:
    return sorted(f for f in os.listdir(folder) if f.endswith(".tmp"))


@pytest.mark.skipif(os.name != "posix", reason="SIGKILL")
def test_sigkill_in_the_middle_of_a_write_keeps_the_previous_checkpoint(tmp_path):
    """The child writes 64 KiB chunks and stops (sleeps) after the third; killed there, its
    temporary file is partly written while the checkpoint is still the old one, bit for bit."""
    path = tmp_path / "ckpt.safetensors"
    save(_big_state(1), path)
    old = path.read_bytes()
    proc = _child(f"""
S._CHUNK = 1 << 16
real_write, calls = os.write, [0]
def write(fd, data):
    n = real_write(fd, data)
    calls[0] += 1
    if calls[0] == 3:
        print("paused", flush=True)
        time.sleep(600)
    return n
os.write = write
S.save(big_state(2), {str(path)!r})
""")
    assert proc.stdout.readline() == b"paused\n"
    temps = _temp_files(tmp_path)
    assert len(temps) == 1 and temps[0].startswith(f".ckpt.safetensors.{proc.pid}.")
    assert os.path.getsize(tmp_path / temps[0]) == 3 << 16 < len(old)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert path.read_bytes() == old
    assert_same(_big_state(1), load(path))
    save(_big_state(3), path)  # the killed save's leftover does not get in the way
    assert_same(_big_state(3), load(path))
    assert _temp_files(tmp_path) == temps


@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix", reason="SIGKILL")
def test_sigkill_at_random_moments_leaves_the_old_or_the_new_checkpoint(tmp_path):
    """A child saves states 2 and 1 alternately without pause and is killed at a random moment
    (10 times): the file always loads as one of the two states, bit for bit. (The files' bytes
    are not compared: safetensors orders the metadata keys differently from run to run.)"""
    path = tmp_path / "ckpt.safetensors"
    save(_big_state(1), path)
    rng, outcomes = random.Random(14), []
    for _ in range(10):
        proc = _child(f"""
print("ready", flush=True)
while True:
    for k in (2, 1):
        S.save(big_state(k), {str(path)!r})
""")
        assert proc.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
        loaded = load(path)  # raises on a partial or mixed file
        k = loaded["step"]
        assert k in (1, 2)
        assert_same(_big_state(k), loaded)
        outcomes.append(k)
    assert all(t.startswith(".ckpt.safetensors.") for t in _temp_files(tmp_path))
    leftovers = _temp_files(tmp_path)
    save(_big_state(3), path)
    assert _temp_files(tmp_path) == leftovers and load(path)["step"] == 3
    print(f"kills: final file state {outcomes}; {len(leftovers)} killed mid-write")


def test_a_top_level_metadata_key_is_refused_not_written_unreadable(tmp_path):
    """safetensors keeps its header under ``__metadata__``: an array saved at that tensor key
    made a file ``load`` refused; ``save`` refuses it and writes nothing."""
    path = tmp_path / "m.safetensors"
    with pytest.raises(ValueError, match="reserves for its header; rename the key"):
        save({"__metadata__": np.ones(1)}, path)
    assert not path.exists()
    save({"x": {"__metadata__": np.ones(1)}}, path)         # nested: the key is x.__metadata__
    np.testing.assert_array_equal(load(path)["x"]["__metadata__"], np.ones(1))


def test_a_key_utf8_cannot_encode_and_a_text_file_get_their_own_messages(tmp_path):
    """A new user's findings: a lone surrogate in a key was safetensors' UnicodeEncodeError; a
    text file was "truncated: its header alone needs 9041958646216097155" bytes."""
    with pytest.raises(ValueError, match=r"has the key '\\ud800', which UTF-8 cannot encode"):
        mf.save({"\ud800": np.ones(2)}, str(tmp_path / "a.safetensors"))
    assert not list(tmp_path.iterdir())
    (tmp_path / "t.safetensors").write_text("{}" * 10)
    with pytest.raises(CheckpointError, match=r"is not a safetensors file: it starts with text"):
        mf.load(str(tmp_path / "t.safetensors"))
