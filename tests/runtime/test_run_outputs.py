"""Outputs from a split run (issue 55, 3): `edgesplit run --input` sends every row, gives each
row's outputs back (`--out` .npz, `--json`) with its difference from the unsplit model and a
classifier's top-1 class; `ChainClient.infer` does the same from Python."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from edgesplit.cli import app
from edgesplit.errors import ConfigError
from edgesplit.runtime.client import ChainClient
from edgesplit.runtime.outputs import OutputCollector, split_rows
from helpers import server_for

runner = CliRunner()
ROWS = 8
TOL = 1e-4  # a float plan: the split differs from the unsplit model by float rounding


def _rows(n: int = ROWS, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 1, 32, 32, generator=torch.Generator().manual_seed(seed))


def _unsplit(program, x: torch.Tensor) -> torch.Tensor:
    """The unsplit model on each row alone (the plan's batch is 1), rows in order."""
    return torch.cat([program.unsplit([x[i:i + 1]])[0] for i in range(len(x))])


@pytest.fixture(scope="module")
def served(digits_chain, tmp_path_factory):
    """digits_cnn's cloud part served on 127.0.0.1, its plan file, and 8 labelled rows."""
    folder = tmp_path_factory.mktemp("outputs")
    plan = folder / "plan.json"
    digits_chain.plan.save(plan)
    data = folder / "frames.npz"
    x = _rows()
    np.savez(data, inputs=x.numpy(), labels=np.arange(ROWS) % 10)
    server = server_for(digits_chain, "cloud", shape=False)
    port = server.start("127.0.0.1", 0)
    yield SimpleNamespace(plan=plan, data=data, x=x, address=f"127.0.0.1:{port}",
                          want=_unsplit(digits_chain, x))
    server.stop(grace_s=1.0)


def _run(served, *args: str):
    return runner.invoke(app, ["run", str(served.plan), "--server", served.address,
                               "--input", str(served.data), "--timeout-s", "30", *args])


def test_every_row_goes_and_its_outputs_come_back_in_an_npz(digits_chain, served, tmp_path):
    out = tmp_path / "out.npz"
    result = _run(served, "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["requests"], doc["ok"], doc["errors"]) == (ROWS, ROWS, 0)  # not one request
    section = doc["outputs"]
    assert section["file"] == str(out) and "values" not in section  # the path, not the data
    assert (section["unit"], section["count"], section["answered"]) == ("row", ROWS, ROWS)
    (name,) = digits_chain.outputs
    assert section["tensors"] == [{"name": name, "shape": [ROWS, 10], "dtype": "float32"}]
    with np.load(out, allow_pickle=False) as saved:
        assert set(saved.files) == {"outputs", "output_names", "answered", "max_abs_diff",
                                    "top1", "unsplit_top1", "labels"}
        got = torch.from_numpy(saved["outputs"])
        assert got.shape == (ROWS, 10)
        assert torch.allclose(got, served.want, atol=TOL, rtol=TOL)
        assert list(saved["output_names"]) == [name]
        assert saved["answered"].all()
        diffs = saved["max_abs_diff"]
        assert diffs.shape == (ROWS,) and (diffs <= TOL).all()
        assert diffs == pytest.approx((got - served.want).abs().amax(1).numpy(), abs=1e-6)
        assert (saved["top1"] == served.want.argmax(1).numpy()).all()
        assert (saved["unsplit_top1"] == served.want.argmax(1).numpy()).all()
        assert (saved["labels"] == np.arange(ROWS)).all()  # the inputs file's own


def test_json_holds_small_outputs_labels_and_rows_in_order_from_several_clients(digits_chain,
                                                                                 served):
    result = _run(served, "-c", "3", "--json")  # answers arrive out of order: rows must not
    assert result.exit_code == 0, result.output
    section = json.loads(result.stdout)["outputs"]
    assert section["classifier"] is True and "argmax" in section["top1"]
    values = torch.tensor(section["values"][digits_chain.outputs[0]])
    assert torch.allclose(values, served.want, atol=TOL, rtol=TOL)
    assert section["top1_labels"] == served.want.argmax(1).tolist()
    assert section["unsplit_top1_labels"] == section["top1_labels"]
    assert section["top1_agree"] == ROWS
    assert len(section["max_abs_diff"]) == ROWS and max(section["max_abs_diff"]) <= TOL
    want_acc = float((served.want.argmax(1) == torch.arange(ROWS) % 10).float().mean())
    assert section["accuracy"] == {"split": want_acc, "unsplit": want_acc}


def test_the_table_lists_rows_and_says_where_the_rest_go(served, tmp_path):
    result = _run(served, "--out", str(tmp_path / "o.npz"))
    assert result.exit_code == 0, result.output
    assert f"outputs: {ROWS}/{ROWS} rows answered" in result.stdout
    assert "top-1 agrees with the unsplit model" in result.stdout
    assert "o.npz" in result.stdout


def test_fewer_requests_than_rows_says_so_and_leaves_the_rest_empty(served):
    result = _run(served, "-n", "2", "--json")
    assert result.exit_code == 0, result.output
    assert "sends 2 of the 8 requests" in result.stderr
    section = json.loads(result.stdout)["outputs"]
    assert section["answered"] == 2
    assert section["max_abs_diff"][2:] == [None] * (ROWS - 2)
    assert section["top1_labels"][2:] == [-1] * (ROWS - 2)


def test_chain_client_infer_returns_every_rows_outputs(digits_chain, served):
    with ChainClient(digits_chain, served.address, timeout_s=30) as client:
        (got,) = client.infer([served.x])
        result = client.request([served.x[:1]])  # one batch: its outputs, as before
    assert got.shape == (ROWS, 10)
    assert torch.allclose(got, served.want, atol=TOL, rtol=TOL)
    assert torch.allclose(result.outputs[0], served.want[:1], atol=TOL, rtol=TOL)
    assert set(result.breakdown_ms) == {"edge", "serialize", "transfer", "remote", "total"}


@pytest.mark.parametrize(("arrays", "args", "message"), [
    ({"inputs": np.zeros((8, 1, 32, 32), np.float32), "labels": np.zeros(7)}, [],
     "same number of samples"),
    ({"inputs": np.zeros((8, 3, 32, 32), np.float32)}, [], "samples of shape (3, 32, 32)"),
    ({"images": np.zeros((8, 1, 32, 32), np.float32)}, [], "needs an array named 'inputs'"),
    (None, [], "cannot read evaluation data"),
    ({"inputs": np.zeros((8, 1, 32, 32), np.float32)}, ["--out", "out.csv"], "FILE.npz"),
])
def test_a_bad_inputs_file_or_out_is_refused_in_one_line(digits_chain, tmp_path, arrays, args,
                                                         message):
    plan, data = tmp_path / "plan.json", tmp_path / "in.npz"
    digits_chain.plan.save(plan)
    if arrays is None:
        data.write_bytes(b"not an npz")
    else:
        np.savez(data, **arrays)
    result = runner.invoke(app, ["run", str(plan), "--server", "127.0.0.1:1", "--input",
                                 str(data), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) <= 2  # one line, wrapped at most once


def test_out_without_inputs_is_refused(digits_chain, tmp_path):
    plan = tmp_path / "plan.json"
    digits_chain.plan.save(plan)
    result = runner.invoke(app, ["run", str(plan), "--server", "127.0.0.1:1", "--out",
                                 str(tmp_path / "o.npz")])
    assert result.exit_code == 2 and "give --input" in result.output


def test_split_rows_cuts_into_the_plans_batch_and_refuses_a_remainder(digits_chain):
    batches = split_rows(digits_chain, [_rows(3).double()])
    assert len(batches) == 3 and batches[0][0].shape == (1, 1, 32, 32)
    assert batches[0][0].dtype == torch.float32  # what the model takes
    with pytest.raises(ConfigError, match="the model takes 1 input"):
        split_rows(digits_chain, [_rows(2), _rows(2)])


def test_outputs_without_a_row_dimension_are_one_per_request(digits_chain):
    """A model whose output is no longer per row (it reduced its batch): a unit is a request,
    and no top-1 is claimed."""
    batches = [(x,) for x in _rows(3).split(1)]
    collector = OutputCollector(digits_chain, batches)
    for i in (0, 2):
        out = torch.tensor([float(i), 1.0, 2.0])
        collector.add(i, SimpleNamespace(outputs=(out + 0.5,)), (out,))
    got = collector.result(lambda b: (torch.zeros(3),))
    assert not got.per_row and got.top1 is None
    assert got.values[0].shape == (3, 3)
    assert got.answered.tolist() == [True, False, True]
    assert got.max_abs_diff[0] == 0.5 and torch.isnan(got.max_abs_diff[1])
    assert got.document()["unit"] == "request"
