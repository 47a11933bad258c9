""".pt2 files that would run code when loaded are refused unless the user trusts them.

``torch.export.load`` unpickles weights and constants flagged ``use_pickle`` (with
``weights_only=False``), object constants, and sample inputs that the safe unpickler refuses;
each test crafts such an archive whose pickle would create a marker file, and checks that
edgesplit refuses it (naming the file and ``--trust-model-file``) and that the marker was never
created. Ordinary ``torch.export.save`` files load without the flag.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.export.pt2_archive._package import PT2ArchiveReader, PT2ArchiveWriter
from typer.testing import CliRunner

from edgesplit.cli import app
from edgesplit.errors import CaptureError, ConfigError
from edgesplit.graph import (
    ModelFileLimits,
    TrustedModelFile,
    capture,
    load_program,
    unsafe_payloads,
)
from edgesplit.hardware import get_device, get_link
from edgesplit.plan import EdgeCloudSetting, PlanningProblem, load_plan
from edgesplit.plan.planners import Manual
from edgesplit.runtime import PlanProgram

runner = CliRunner()
WEIGHTS_CONFIG = "data/weights/model_weights_config.json"
CONSTANTS_CONFIG = "data/constants/model_constants_config.json"


class _CreatesFile:
    """Unpickling this opens (creates) ``path``: a stand-in for any code."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (builtins.open, (self.path, "w"))


def _saved(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _tiny(tmp_path: Path) -> Path:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    path = tmp_path / "tiny.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(1, 4),)), str(path))
    return path


def _rewrite(src: Path, dst: Path, edit) -> Path:
    """Copy a PT2 archive record by record, letting ``edit`` change the records."""
    with PT2ArchiveReader(str(src)) as reader:
        records = {name: reader.read_bytes(name) for name in reader.get_file_names()}
    edit(records)
    with PT2ArchiveWriter(str(dst)) as writer:
        for name, data in records.items():
            writer.write_bytes(name, data)
    return dst


def _pickle_first_weight(payload: bytes):
    def edit(records: dict[str, bytes]) -> None:
        config = json.loads(records[WEIGHTS_CONFIG])
        first = next(iter(config["config"].values()))
        first["use_pickle"] = True
        records[WEIGHTS_CONFIG] = json.dumps(config).encode()
        records["data/weights/" + first["path_name"]] = payload
    return edit


@pytest.fixture
def marker(tmp_path) -> Path:
    return tmp_path / "code-ran"


@pytest.fixture
def evil_weights(tmp_path, marker) -> Path:
    return _rewrite(_tiny(tmp_path), tmp_path / "evil.pt2",
                    _pickle_first_weight(_saved(_CreatesFile(marker))))


def test_ordinary_saved_program_loads_without_the_flag(tmp_path):
    path = _tiny(tmp_path)
    assert unsafe_payloads(path.read_bytes()) == []
    graph = capture(path)
    assert [layer.op for layer in graph.layers] == ["linear", "linear"]


def test_pickled_weight_is_refused_and_never_unpickled(evil_weights, marker):
    with pytest.raises(CaptureError, match=r"evil\.pt2.*0\.weight.*trust_model_file=True"):
        capture(evil_weights)
    with pytest.raises(CaptureError, match="trust_model_file=True"):
        load_program(evil_weights)
    assert not marker.exists()
    # the check is what stopped it: torch itself runs the pickle
    with pytest.raises(Exception):  # noqa: B017  # any error: the marker shows the pickle ran
        torch.export.load(str(evil_weights))
    assert marker.exists()


def test_sample_inputs_that_need_the_unsafe_unpickler_are_refused(tmp_path, marker):
    def edit(records):  # torch retries these with weights_only=False when the safe load fails
        records["data/sample_inputs/model.pt"] = _saved(_CreatesFile(marker))

    path = _rewrite(_tiny(tmp_path), tmp_path / "inputs.pt2", edit)
    with pytest.raises(CaptureError, match=r"sample_inputs/model\.pt"):
        capture(path)
    assert not marker.exists()


def test_object_constants_are_refused_whatever_use_pickle_says(tmp_path, marker):
    import pickle

    def edit(records):  # torch picks pickle.loads by the opaque_obj_ file name alone
        records[CONSTANTS_CONFIG] = json.dumps({"config": {"c": {
            "path_name": "opaque_obj_0", "is_param": False, "use_pickle": False,
            "tensor_meta": None}}}).encode()
        records["data/constants/opaque_obj_0"] = pickle.dumps(_CreatesFile(marker))

    path = _rewrite(_tiny(tmp_path), tmp_path / "const.pt2", edit)
    with pytest.raises(CaptureError, match="opaque_obj_0"):
        capture(path)
    assert not marker.exists()


def test_pre_2_8_archives_are_refused(tmp_path, marker):
    path = tmp_path / "old.pt2"  # torch.export.load falls back to this format and unpickles it
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("version", "8.0")
        zf.writestr("serialized_state_dict.pt", _saved(_CreatesFile(marker)))
    with pytest.raises(CaptureError, match=r"pre-2\.8"):
        capture(path)
    assert not marker.exists()


def test_trusted_pickled_file_loads(tmp_path):
    path = _tiny(tmp_path)
    with PT2ArchiveReader(str(path)) as reader:
        config = json.loads(reader.read_string(WEIGHTS_CONFIG))
    first = next(iter(config["config"]))
    weight = torch.export.load(str(path)).state_dict[first]
    pickled = _rewrite(path, tmp_path / "pickled.pt2",
                       _pickle_first_weight(_saved(nn.Parameter(weight.detach().clone()))))
    with pytest.raises(CaptureError, match="trust_model_file=True"):
        capture(pickled)
    graph = capture(pickled, trust_model_file=True)
    assert len(graph.layers) == 2
    assert len(capture(TrustedModelFile(str(pickled))).layers) == 2


def _plan_for(source: str) -> Path:
    setting = EdgeCloudSetting(edge=get_device("jetson-nano"), cloud=get_device("v100-server"),
                               link=get_link("4g"))
    problem = PlanningProblem(source, setting)
    plan = Manual([problem.graph.layers[0].name]).plan(problem)
    assert plan.model.source == str(source) and type(plan.model.source) is str  # trust: not kept
    out = Path(source).with_suffix(".json")
    plan.save(out)
    return out


def test_plans_pointing_at_a_pickled_file_need_the_flag_everywhere(tmp_path, evil_weights,
                                                                  marker):
    plan_path = _plan_for(str(_tiny(tmp_path)))
    doc = json.loads(plan_path.read_text())
    doc["model"]["source"] = str(evil_weights)  # a plan can name any file
    plan_path.write_text(json.dumps(doc))
    with pytest.raises(CaptureError, match="trust_model_file=True"):
        PlanProgram.load(load_plan(plan_path))
    for args in (["inspect", str(evil_weights)], ["export", str(plan_path), "-o",
                                                  str(tmp_path / "x")],
                 ["serve", str(plan_path), "--device", "cloud", "--port", "0"],
                 ["run", str(plan_path), "--server", "127.0.0.1:1"],
                 ["plan", str(evil_weights), "--method", "neurosurgeon"],
                 ["profile", str(evil_weights), "--no-onnx"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert "--trust-model-file" in result.output and "Traceback" not in result.output
    assert not marker.exists()


def test_trust_flag_reaches_the_planners_and_the_runtime(tmp_path):
    path = _tiny(tmp_path)
    weight = torch.export.load(str(path)).state_dict["0.weight"]
    pickled = _rewrite(path, tmp_path / "pickled.pt2",
                       _pickle_first_weight(_saved(nn.Parameter(weight.detach().clone()))))
    plan_path = _plan_for(TrustedModelFile(str(pickled)))
    program = PlanProgram.load(load_plan(plan_path), trust_model_file=True)
    out, _ = program.run_local()
    assert torch.equal(out[0], program.unsplit()[0])
    result = runner.invoke(app, ["plan", str(pickled), "--method", "neurosurgeon",
                                 "--trust-model-file", "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "p.json").read_text())["model"]["source"] == str(pickled)


def test_output_types_of_unknown_packages_are_not_imported_for_an_untrusted_file(tmp_path):
    import sys

    def edit(records):  # the program's output spec names a class of some other package
        doc = json.loads(records["models/model.json"])
        entry = doc["graph_module"]["module_call_graph"][0]["signature"]
        entry["out_spec"] = entry["out_spec"].replace('"type": null',
                                                      '"type": "edgesplit_nowhere.mod.Out"', 1)
        records["models/model.json"] = json.dumps(doc).encode()

    path = _rewrite(_tiny(tmp_path), tmp_path / "typed.pt2", edit)
    with pytest.raises(CaptureError, match=r"edgesplit_nowhere\.mod\.Out.*trust_model_file=True"):
        capture(path)
    with pytest.raises(CaptureError, match=r"'edgesplit_nowhere\.mod' cannot be imported"):
        capture(path, trust_model_file=True)
    assert "edgesplit_nowhere" not in sys.modules


def test_input_shape_of_a_model_file_is_used_where_it_fits_and_refused_in_one_line(tmp_path):
    fixed = _tiny(tmp_path)  # exported at 1,4
    assert capture(fixed, input_shape=(1, 4)).example_inputs[0].shape == (1, 4)
    with pytest.raises(ConfigError) as info:
        capture(fixed, input_shape=(2, 4))
    message = str(info.value)
    assert "\n" not in message and "tiny.pt2' fixes its input shape to 1,4" in message
    assert "re-export the model" in message
    # refused before any other work: the missing --eval-data file is never reached
    result = runner.invoke(app, ["plan", str(fixed), "--input-shape", "2,4", "--eval-data",
                                 str(tmp_path / "missing.pt")])
    assert result.exit_code == 2
    assert "error: model file" in result.output and "--input-shape 2,4 does not fit" in \
        result.output and "missing.pt" not in result.output

    # a program exported with a dynamic batch takes any batch its range allows
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    dynamic = tmp_path / "dynamic.pt2"
    batch = torch.export.Dim("batch", min=1, max=64)
    torch.export.save(torch.export.export(model, (torch.randn(3, 4),),
                                          dynamic_shapes=({0: batch},)), str(dynamic))
    graph = capture(dynamic, input_shape=(5, 4))
    assert graph.example_inputs[0].shape == (5, 4)
    assert [t.shape for t in graph.tensors.values()] == [(5, 4), (5, 8), (5, 2)]
    assert graph.total_macs == 5 * (4 * 8 + 8 * 2)
    plan = Manual(["0"]).plan(PlanningProblem(str(dynamic), EdgeCloudSetting(
        edge=get_device("jetson-nano"), cloud=get_device("v100-server"), link=get_link("4g")),
        input_shape=(5, 4)))
    program = PlanProgram.load(plan)  # captured again at the planned shape
    out, _ = program.run_local()
    assert out[0].shape == (5, 2) and torch.equal(out[0], program.unsplit()[0])
    with pytest.raises(ConfigError, match=r"fixes its input shape to 1\.\.64,4 .*dimension 0 "
                                          r"takes 1\.\.64"):
        capture(dynamic, input_shape=(100, 4))


def test_profile_batch_size_of_a_model_file(tmp_path):
    """--batch-size on a .pt2 takes the file's own input shape (it looked the path up as a
    built-in name before); a fixed batch is refused in one line naming --batch-size."""
    fixed = _tiny(tmp_path)  # exported at 1,4
    result = runner.invoke(app, ["profile", str(fixed), "--batch-size", "2", "--repeats", "1",
                                 "--warmup", "0", "--no-onnx"])
    assert result.exit_code == 2
    assert "--batch-size 2: model file" in result.output and "unknown model" not in \
        result.output
    ok = runner.invoke(app, ["profile", str(fixed), "--batch-size", "1", "--repeats", "1",
                             "--warmup", "0", "--no-onnx", "--json"])
    assert ok.exit_code == 0, ok.output


# ---- bounded reading: zip bombs, oversized files, files of other kinds ------------------------
BOMB_MIB = 64


def _bomb(tmp_path: Path, entry: str = "data/sample_inputs/model.pt",
          declared: int | None = None) -> Path:
    """A copy of the tiny program whose ``entry`` inflates to BOMB_MIB MiB of zeros (about
    64 KiB on disk); ``declared``: the size its central directory states instead (a lie)."""
    src = _tiny(tmp_path)
    path = tmp_path / "bomb.pt2"
    with zipfile.ZipFile(src) as old, zipfile.ZipFile(path, "w") as new:
        prefix = old.namelist()[0].split("/")[0]
        for info in old.infolist():
            if info.filename != f"{prefix}/{entry}":
                new.writestr(info, old.read(info))
        info = zipfile.ZipInfo(f"{prefix}/{entry}")
        info.compress_type = zipfile.ZIP_DEFLATED
        with new.open(info, "w") as out:
            for _ in range(BOMB_MIB):
                out.write(bytes(1 << 20))
    if declared is not None:  # patch the central directory's uncompressed size
        data = bytearray(path.read_bytes())
        name = f"{prefix}/{entry}".encode()
        at = data.rfind(b"PK\x01\x02", 0, data.rfind(name))
        assert data[at + 46:at + 46 + len(name)] == name
        data[at + 24:at + 28] = declared.to_bytes(4, "little")
        path.write_bytes(bytes(data))
    return path


def _peak(fn) -> tuple[int, BaseException | None]:
    """Python's peak allocation (bytes objects included) while ``fn`` runs, and its error."""
    import tracemalloc

    tracemalloc.start()
    try:
        fn()
        error = None
    except Exception as exc:  # the caller asserts which
        error = exc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak, error


def test_a_zip_bomb_is_refused_from_its_directory_without_inflating_it(tmp_path):
    bomb = _bomb(tmp_path)
    assert bomb.stat().st_size < 1 << 20  # a 64 MiB entry in well under a megabyte
    low = ModelFileLimits(max_bytes=16 << 20)
    peak, error = _peak(lambda: load_program(bomb, limits=low))
    assert isinstance(error, CaptureError)
    assert "would inflate to 64.0 MiB" in str(error) and "sample_inputs/model.pt" in str(error)
    assert "EDGESPLIT_MAX_MODEL_FILE to at least 65MiB" in str(error)
    assert peak < 4 << 20, peak  # the entry (64 MiB) was never inflated
    # the default bound on inflating (4 times the file's size past a slack) refuses it too
    ratio = ModelFileLimits(ratio_slack_bytes=1 << 20)
    peak, error = _peak(lambda: load_program(bomb, limits=ratio))
    assert isinstance(error, CaptureError) and "zip bomb" in str(error), error
    assert peak < 4 << 20, peak
    # a trusted file is bounded the same way: trust is about code, not memory
    with pytest.raises(CaptureError, match="zip bomb"):
        load_program(TrustedModelFile(str(bomb)), limits=ratio)


def test_declared_sizes_bound_every_read_even_when_they_lie(tmp_path):
    """What the directory check relies on (torch's behaviour, pinned here): an entry whose
    directory declares 1 KiB but whose stream inflates to 64 MiB is inflated by torch's reader
    into a buffer of the declared size, which stops there, so nothing larger is allocated
    (the truncated pickle is then refused)."""
    bomb = _bomb(tmp_path, declared=1024)
    peak, error = _peak(lambda: load_program(bomb, limits=ModelFileLimits(max_bytes=16 << 20)))
    assert isinstance(error, CaptureError), error
    assert peak < 4 << 20, peak


def test_a_file_over_the_limit_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.pt2"
    big.write_bytes(bytes(8 << 20))
    peak, error = _peak(lambda: load_program(big, limits=ModelFileLimits(max_bytes=1 << 20)))
    assert isinstance(error, CaptureError)
    assert "is 8388608 bytes, over the 1048576 bytes" in str(error)
    assert "EDGESPLIT_MAX_MODEL_FILE to at least 8MiB" in str(error)
    assert peak < 1 << 20, peak
    # within the limit, a file that is no zip at all is refused from its (missing) directory
    peak, error = _peak(lambda: load_program(big))
    assert isinstance(error, CaptureError) and "not a zip archive" in str(error)
    assert peak < 1 << 20, peak


def test_the_limit_comes_from_the_environment(tmp_path, monkeypatch):
    path = _tiny(tmp_path)
    monkeypatch.setenv("EDGESPLIT_MAX_MODEL_FILE", "1KiB")
    assert ModelFileLimits.from_env().max_bytes == 1024
    with pytest.raises(CaptureError, match="EDGESPLIT_MAX_MODEL_FILE to at least"):
        capture(path)
    monkeypatch.setenv("EDGESPLIT_MAX_MODEL_FILE", "lots")
    with pytest.raises(ConfigError, match="EDGESPLIT_MAX_MODEL_FILE 'lots' is not a size"):
        capture(path)
    monkeypatch.setenv("EDGESPLIT_MAX_MODEL_FILE", "32GiB")
    assert len(capture(path).layers) == 2


@pytest.mark.parametrize("kind", ["model.onnx", "state.pt", "scripted.pt", "missing.pt"])
def test_files_that_are_not_exported_programs_say_which_files_work(tmp_path, kind):
    path = tmp_path / kind
    module = nn.Linear(4, 2)
    if kind == "model.onnx":
        path.write_bytes(b"\x08\x07\x12\x07pytorch")  # what an ONNX file starts with
    elif kind == "state.pt":
        torch.save(module.state_dict(), path)
    elif kind == "scripted.pt":
        torch.jit.save(torch.jit.script(module), str(path))
    for args in (["inspect", str(path)], ["profile", str(path), "--batch-size", "2"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        line = result.output.strip()
        assert "\n" not in line and kind in line, line
        assert "torch.export.save(torch.export.export(model" in line
        assert "unknown model" not in line and "input-shape" not in line


def test_elastify_takes_model_files_by_the_same_rule(tmp_path):
    """``nas adaptivenet elastify missing.onnx`` said "unknown model" (only .pt2/.pt/.pth were
    files); the file is hashed streamed, not read whole."""
    from edgesplit.nas.adaptivenet.checkpoint import model_source

    with pytest.raises(ConfigError, match=r"model file .*missing\.onnx does not exist.*"
                                          r"torch\.export\.save"):
        model_source("missing.onnx")  # no folder: it used to be looked up as a model name
    path = _tiny(tmp_path)
    assert model_source(str(path))["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
