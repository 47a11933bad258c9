"""A plan's model path (a checkpoint folder, a .pt2) is stored relative to the plan file, so a
plan made in one folder runs from any other: the ``LLMClient`` snippet of docs/systems/llm.md
from another folder, a vision plan's ``.pt2`` captured again, and plans written before (paths
relative to the folder they were made in) still read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from edgesplit.cli import app
from edgesplit.hardware import chain, get_topology
from edgesplit.llm import LLMWorkload, plan_llm_at
from edgesplit.models.causal_lm import create_causal_lm
from edgesplit.plan import load_plan
from edgesplit.runtime import plan_id
from helpers import listening

runner = CliRunner()


@pytest.fixture(scope="module")
def made_in(tmp_path_factory) -> Path:
    """A folder holding a tiny Llama checkpoint (``ckpt``) and, in ``plans/``, a two-stage
    plan of it made from that folder with the relative path ``ckpt``."""
    root = tmp_path_factory.mktemp("made")
    torch.manual_seed(0)
    create_causal_lm("llama_tiny").save_pretrained(root / "ckpt", safe_serialization=True)
    full = get_topology("home-wifi")
    topology = chain("two", full.devices[:2], [full.links[0].link])
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        plan = plan_llm_at("ckpt", topology, (0, 3, 6),
                           LLMWorkload(prompt_tokens=4, new_tokens=4, max_context=16))
        (root / "plans").mkdir()
        plan.save("plans/plan.json")
    return root


def test_a_path_given_relative_is_stored_relative_to_the_plan_file(made_in):
    stored = json.loads((made_in / "plans" / "plan.json").read_text())["model"]["source"]
    assert stored == "../ckpt"


def test_the_readme_llm_client_snippet_runs_from_another_folder(made_in, tmp_path,
                                                                monkeypatch):
    from edgesplit.llm.generate.client import LLMClient

    monkeypatch.chdir(tmp_path)  # no ckpt here: it is found beside the plan
    path = made_in / "plans" / "plan.json"
    # the docs' snippet, the plan's path and the port aside
    with (listening(load_plan(path), "laptop", data_port=None) as (_, address),
          LLMClient(load_plan(path), address, session="chat-1") as client):
        tokens = [t.token for t in client.generate([5, 0, 17, 42], 4)]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(made_in / "ckpt").eval()
    ids = torch.tensor([[5, 0, 17, 42]])
    expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4,
                              min_new_tokens=4, do_sample=False, pad_token_id=0)
    assert tokens == expected[0, 4:].tolist()


def test_where_a_plan_is_read_from_does_not_change_its_id(made_in, tmp_path, monkeypatch):
    """Each device may keep its copy of the plan elsewhere: they must agree on the plan."""
    path = made_in / "plans" / "plan.json"
    here = plan_id(load_plan(path))
    copy = tmp_path / "elsewhere" / "plan.json"
    copy.parent.mkdir()
    copy.write_text(path.read_text())
    monkeypatch.chdir(tmp_path)
    assert plan_id(load_plan(copy)) == here


def test_plans_written_before_still_read(made_in, tmp_path, monkeypatch):
    """A bare relative path is the working folder's first (as it always was), else the plan
    file's; a name is left alone."""
    doc = json.loads((made_in / "plans" / "plan.json").read_text())
    doc["model"]["source"] = "ckpt"
    old = made_in / "old.json"
    old.write_text(json.dumps(doc))
    monkeypatch.chdir(made_in)
    assert load_plan(old).model.local_source == "ckpt"
    monkeypatch.chdir(tmp_path)
    assert Path(load_plan(old).model.local_source) == made_in / "ckpt"
    doc["model"]["source"] = "llama_tiny"
    old.write_text(json.dumps(doc))
    assert load_plan(old).model.local_source == "llama_tiny"


def test_saving_again_elsewhere_keeps_the_path_pointing_at_the_same_files(made_in, tmp_path):
    plan = load_plan(made_in / "plans" / "plan.json")
    plan.save(tmp_path / "plan.json")
    again = load_plan(tmp_path / "plan.json")
    assert Path(again.model.local_source).resolve() == (made_in / "ckpt").resolve()


def test_a_vision_plan_of_a_pt2_runs_from_another_folder(tmp_path, monkeypatch):
    from edgesplit.runtime import PlanProgram

    made, other = tmp_path / "made", tmp_path / "other"
    made.mkdir()
    other.mkdir()
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    example = (torch.randn(1, 1, 8, 8),)
    torch.export.save(torch.export.export(model.eval(), example), str(made / "model.pt2"))
    monkeypatch.chdir(made)
    done = runner.invoke(app, ["plan", "model.pt2", "--trust-model-file", "--method",
                               "cloud_only", "--out", "plan.json"])
    assert done.exit_code == 0, done.output
    assert json.loads((made / "plan.json").read_text())["model"]["source"] == "./model.pt2"
    monkeypatch.chdir(other)
    program = PlanProgram.load(load_plan(made / "plan.json"), trust_model_file=True)
    assert program.plan.model.source == "./model.pt2"


def test_a_plan_read_from_a_file_equals_the_plan_written(made_in):
    """Where the file lies is kept beside the plan, not in it: equality is the content's."""
    from edgesplit.plan.model import Plan

    path = made_in / "plans" / "plan.json"
    assert load_plan(path) == Plan.model_validate_json(path.read_text())
    assert hash(load_plan(path).model) == hash(Plan.model_validate_json(path.read_text()).model)
