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
