"""safetensors: round trips, files shared with the `safetensors` package, and damaged files refused."""
import json

import numpy as np
import pytest

import tinyattn as ta
from tinyattn.safetensors import SafetensorsError


def sample_arrays():
    rng = np.random.default_rng(0)
    return {
        "w32": rng.standard_normal((3, 5)).astype(np.float32),
        "w16": rng.standard_normal((7,)).astype(np.float16),
        "w64": rng.standard_normal((2, 2, 2)),
        "ids": rng.integers(-2**40, 2**40, (4, 3), dtype=np.int64),
        "mask": rng.random((2, 5)) < 0.5,
        "empty": np.zeros((0, 4), np.float32),
        "scalar": np.array(2.5, np.float32),
        "flag": np.array(True),
        "i32": np.arange(5, dtype=np.int32),
        "u8": np.arange(9, dtype=np.uint8).reshape(3, 3),
    }


def assert_same(got, want):
    assert list(sorted(got)) == list(sorted(want))
    for name, a in want.items():
        g = got[name].numpy() if isinstance(got[name], ta.Tensor) else got[name]
        assert g.dtype == a.dtype and g.shape == a.shape, name
        assert np.array_equal(g, a), name


def test_round_trip_every_dtype(tmp_path):
    arrays = sample_arrays()
    path = tmp_path / "a.safetensors"
    ta.save_safetensors(arrays, path, metadata={"format": "np", "note": "hi"})
    got, metadata = ta.read_safetensors(path)
    assert_same(got, arrays)
    assert metadata == {"format": "np", "note": "hi"}
    got["w32"][0, 0] = 1.0                                  # arrays come back writable


def test_load_gives_tensors_and_a_model_round_trips(tmp_path):
    from tinyattn.models import GPT, GPTConfig
    ta.manual_seed(0)
    model = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8))
    ta.save_safetensors(model.state_dict(), tmp_path / "m.safetensors")
    loaded = ta.load_safetensors(tmp_path / "m.safetensors")
    assert all(isinstance(t, ta.Tensor) for t in loaded.values())
    other = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8, init="default"))
    other.load_state_dict(loaded)
    idx = ta.tensor(np.arange(8)[None] % 11)
    assert np.array_equal(other(idx)[0].numpy(), model(idx)[0].numpy())


def test_load_refuses_dtypes_a_tensor_cannot_hold(tmp_path):
    ta.save_safetensors({"u16": np.arange(3, dtype=np.uint16)}, tmp_path / "u.safetensors")
    with pytest.raises(SafetensorsError, match="'u16' is uint16.*read_safetensors"):
        ta.load_safetensors(tmp_path / "u.safetensors")


def test_layout_header_padded_and_arrays_aligned(tmp_path):
    path = tmp_path / "a.safetensors"
    ta.save_safetensors(sample_arrays(), path)
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert (8 + n) % 8 == 0
    header = json.loads(raw[8:8 + n])
    for name, info in header.items():
        begin = info["data_offsets"][0]
        assert begin % np.dtype(sample_arrays()[name].dtype).itemsize == 0, name


def test_bf16_reads_as_float32(tmp_path):
    want = np.array([1.0, -2.5, 3.140625, 0.0], np.float32)      # each exactly representable in bfloat16
    top = (want.view(np.uint32) >> 16).astype("<u2")
    header = json.dumps({"x": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}).encode()
    path = tmp_path / "bf16.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + top.tobytes())
    got, _ = ta.read_safetensors(path)
    assert got["x"].dtype == np.float32 and np.array_equal(got["x"], want)


def test_save_is_atomic_and_refuses_bad_values(tmp_path):
    path = tmp_path / "a.safetensors"
    ta.save_safetensors({"x": np.ones(3, np.float32)}, path)
    before = path.read_bytes()
    with pytest.raises(SafetensorsError, match="complex128"):
        ta.save_safetensors({"y": np.ones(3, np.complex128)}, path)
    with pytest.raises(SafetensorsError, match="metadata"):
        ta.save_safetensors({"y": np.ones(3)}, path, metadata={"n": 3})
    with pytest.raises(SafetensorsError, match="__metadata__"):
        ta.save_safetensors({"__metadata__": np.ones(3)}, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["a.safetensors"]          # no temporary file left


# --- ta.save and ta.load: state dicts ---------------------------------------------
def test_ta_save_and_load_a_module_state_dict(tmp_path):
    """A module's state dict is an ordinary safetensors file, its names as they are."""
    model = ta.nn.Sequential(ta.nn.Linear(3, 4), ta.nn.RMSNorm(4))
    ta.save(model.state_dict(), tmp_path / "m.safetensors")
    arrays, metadata = ta.read_safetensors(tmp_path / "m.safetensors")
    assert list(arrays) == list(model.state_dict()) and metadata == {}
    loaded = ta.load(tmp_path / "m.safetensors")
    assert all(isinstance(t, ta.Tensor) for t in loaded.values()) and list(loaded) == list(arrays)
    other = ta.nn.Sequential(ta.nn.Linear(3, 4), ta.nn.RMSNorm(4))
    other.load_state_dict(loaded)
    x = ta.randn(2, 3)
    assert np.array_equal(other(x).numpy(), model(x).numpy())


def test_ta_save_and_load_a_checkpoint_resume_training_exactly(tmp_path):
    """Model, Adam and a scheduler saved mid-way, in one file: loaded into new ones, training goes
    on as if it had never stopped."""
    def train(model, opt, sched, steps):
        for _ in range(steps):
            opt.zero_grad()
            ((model(ta.ones(2, 3)) - 1.0) ** 2).mean().backward()
            opt.step()
            sched.step()

    def make():
        ta.manual_seed(0)
        model = ta.nn.Linear(3, 2)
        opt = ta.optim.Adam(model.parameters(), lr=0.1, weight_decay=0.01, amsgrad=True)
        return model, opt, ta.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.2, total_steps=10)

    model, opt, sched = make()
    train(model, opt, sched, 4)
    ta.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
             "step": 4, "note": None}, tmp_path / "ckpt.safetensors")
    train(model, opt, sched, 6)
    model2, opt2, sched2 = make()
    ckpt = ta.load(tmp_path / "ckpt.safetensors")
    assert ckpt["step"] == 4 and ckpt["note"] is None and isinstance(ckpt["optimizer"]["param_groups"][0]["betas"], tuple)
    model2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["optimizer"])
    sched2.load_state_dict(ckpt["scheduler"])
    train(model2, opt2, sched2, 6)
    assert sched2.get_last_lr() == sched.get_last_lr()
    for a, b in zip(model2.parameters(), model.parameters()):
        assert np.array_equal(a.numpy(), b.numpy())


def test_ta_save_keeps_numbers_arrays_and_keys_as_they_were(tmp_path):
    state = {"ints": {0: np.arange(3), 7: [1, 2.5, (True, "x")]}, "inf": float("inf"), "n": np.int64(5),
             "t": ta.tensor([1.0, 2.0], dtype="float64")}
    ta.save(state, tmp_path / "s")
    back = ta.load(tmp_path / "s")
    assert list(back["ints"]) == [0, 7] and isinstance(back["ints"][0], np.ndarray)
    assert back["ints"][7] == [1, 2.5, (True, "x")] and back["inf"] == float("inf") and back["n"] == 5
    assert isinstance(back["t"], ta.Tensor) and back["t"].dtype == ta.float64 and back["t"].tolist() == [1.0, 2.0]
    pytest.importorskip("array_api_strict")
    assert ta.load(tmp_path / "s", map_location="strict")["t"].device == "strict"


def test_ta_save_refuses_what_it_cannot_store_and_leaves_the_file(tmp_path):
    path = tmp_path / "m.safetensors"
    ta.save({"w": ta.ones(2)}, path)
    before = path.read_bytes()
    with pytest.raises(TypeError, match="save: cannot save a object .at w2."):
        ta.save({"w": ta.ones(2), "w2": object()}, path)
    with pytest.raises(TypeError, match="dict keys must be strings or ints"):
        ta.save({(1, 2): ta.ones(2)}, path)
    with pytest.raises(SafetensorsError, match="two arrays would be stored as 'a.b'"):
        ta.save({"a.b": ta.ones(1), "a": {"b": ta.ones(1)}}, path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]


# --- the `safetensors` package reads ours and we read its --------------------------
INTEROP = ("w32", "w16", "w64", "ids", "mask", "empty", "scalar", "flag", "i32", "u8")


def test_files_written_by_safetensors_package_are_read(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    arrays = {k: sample_arrays()[k] for k in INTEROP}
    st.save_file(arrays, str(tmp_path / "theirs.safetensors"), metadata={"format": "np"})
    got, metadata = ta.read_safetensors(tmp_path / "theirs.safetensors")
    assert_same(got, arrays)
    assert metadata == {"format": "np"}


def test_files_written_here_are_read_by_safetensors_package(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    arrays = {k: sample_arrays()[k] for k in INTEROP}
    ta.save_safetensors({k: ta.tensor(v) if k == "w32" else v for k, v in arrays.items()},
                        tmp_path / "ours.safetensors", metadata={"format": "np"})
    assert_same(st.load_file(str(tmp_path / "ours.safetensors")), arrays)
    from safetensors import safe_open
    with safe_open(str(tmp_path / "ours.safetensors"), "np") as f:
        assert f.metadata() == {"format": "np"}


# --- damaged files ---------------------------------------------------------------
def one_line_error(path):
    with pytest.raises(SafetensorsError) as e:
        ta.read_safetensors(path)
    message = str(e.value)
    assert "\n" not in message and message.startswith(str(path))
    return message


def test_truncated_files_are_refused(tmp_path):
    path = tmp_path / "a.safetensors"
    ta.save_safetensors(sample_arrays(), path)
    raw = path.read_bytes()
    messages = set()
    for k in range(8):                                       # 0, 1/8, ..., 7/8 of the file
        cut = tmp_path / f"cut{k}.safetensors"
        cut.write_bytes(raw[:len(raw) * k // 8])
        messages.add(one_line_error(cut).split(": ", 1)[1])
    assert any("truncated" in m for m in messages)


def write_header(path, header, data_size):
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + bytes(data_size))


def f32(begin, end, shape):
    return {"dtype": "F32", "shape": shape, "data_offsets": [begin, end]}


@pytest.mark.parametrize("header, data_size, problem", [
    ({"a": f32(0, 16, [4]), "b": f32(8, 24, [4])}, 24, "overlaps"),
    ({"a": f32(0, 16, [4]), "b": f32(0, 16, [4])}, 32, "overlaps"),
    ({"a": f32(-4, 12, [4])}, 16, "non-negative"),
    ({"a": f32(0, 16, [4]), "b": f32(16, 32, [4])}, 24, "past the end"),
    ({"a": f32(2**62, 2**62 + 16, [4])}, 16, "gap"),
    ({"a": f32(0, 12, [4])}, 12, "needs 16"),
    ({"a": f32(0, 16, [4])}, 20, "cover 16"),
    ({"a": f32(4, 20, [4])}, 20, "gap of 4"),
    ({"a": f32(0, 16, [-4])}, 16, "shape"),
    ({"a": f32(0, 16, [2**40, 2**40])}, 16, "needs"),
    ({"a": {"dtype": "F99", "shape": [4], "data_offsets": [0, 16]}}, 16, "dtype 'F99'"),
    ({"a": {"dtype": "F32", "shape": [4]}}, 16, "needs dtype, shape and data_offsets"),
    ({"a": f32(0, 16, [4]), "__metadata__": {"n": 3}}, 16, "strings"),
    ([1, 2], 0, "not an object"),
])
def test_lying_headers_are_refused(tmp_path, header, data_size, problem):
    path = tmp_path / "bad.safetensors"
    write_header(path, header, data_size)
    assert problem in one_line_error(path)


def test_bad_header_bytes_are_refused(tmp_path):
    path = tmp_path / "bad.safetensors"
    for body, problem in ((b"{not json", "not valid JSON"), (b'{"a": 1, "a": 2}', "appears twice"),
                          (b"\xff\xfe", "not UTF-8")):
        path.write_bytes(len(body).to_bytes(8, "little") + body)
        assert problem in one_line_error(path)
    path.write_bytes((50).to_bytes(8, "little") + b"{}")
    assert "only 2 follow" in one_line_error(path)
    path.write_bytes((2**63).to_bytes(8, "little") + b"{}")
    assert "header length" in one_line_error(path)


def test_files_of_empty_arrays_or_none(tmp_path):
    for arrays in ({}, {"z": np.zeros((0, 2), np.float32)}, {"a": np.ones(3, np.int8), "z": np.zeros(0, np.int8)}):
        ta.save_safetensors(arrays, tmp_path / "e.safetensors")
        got, _ = ta.read_safetensors(tmp_path / "e.safetensors")
        assert_same(got, arrays)


def test_ta_save_of_a_model_is_read_by_pytorch(tmp_path):
    """ta.save of a module's state dict gives what safetensors.torch.load_file reads into a torch model."""
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    model = ta.nn.Linear(3, 2)
    ta.save(model.state_dict(), tmp_path / "m.safetensors")
    theirs = torch.nn.Linear(3, 2)
    theirs.load_state_dict(st.load_file(str(tmp_path / "m.safetensors")))
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_allclose(theirs(torch.tensor(x)).detach().numpy(), model(ta.tensor(x)).numpy(), rtol=1e-6)
    st.save_file(theirs.state_dict(), str(tmp_path / "theirs.safetensors"))
    assert {k: v.tolist() for k, v in ta.load(tmp_path / "theirs.safetensors").items()} == \
        {k: v.tolist() for k, v in theirs.state_dict().items()}
