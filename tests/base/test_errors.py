"""Error messages name the setting that fixes them as the caller writes it."""

from edgesplit.errors import cli_options, option


def test_option_is_a_keyword_argument_in_python():
    assert option("trust_model_file", True) == "trust_model_file=True"
    assert option("max_bytes", "2MiB") == "max_bytes='2MiB'"
    assert option("eval_data") == "eval_data"


def test_option_is_a_flag_under_the_cli():
    with cli_options():
        assert option("trust_model_file", True) == "--trust-model-file"
        assert option("max_bytes", "2MiB") == "--max-bytes 2MiB"
        assert option("split_after", "conv1", flag="--split-after") == "--split-after conv1"
    assert option("eval_data") == "eval_data"  # the style ends with the block


def test_library_messages_name_settings_in_the_callers_style(tmp_path):
    import pytest
    import torch

    from edgesplit.errors import ConfigError
    from edgesplit.graph import capture
    from edgesplit.train.simulator import BandwidthTrace

    with pytest.raises(ConfigError, match=r"needs both drop_at and drop_to"):
        BandwidthTrace(100.0, drop_at=3)
    with cli_options(), pytest.raises(ConfigError, match=r"--restore-at needs a drop \(--drop-at"):
        BandwidthTrace(100.0, restore_at=3)
    path = tmp_path / "model.pt2"
    torch.export.save(torch.export.export(torch.nn.Linear(4, 2), (torch.randn(1, 4),)), path)
    with pytest.raises(ConfigError, match=r": input_shape=\(2, 4\) does not fit"):
        capture(path, input_shape=(2, 4))
    with cli_options(), pytest.raises(ConfigError, match=r": --input-shape 2,4 does not fit"):
        capture(path, input_shape=(2, 4))
