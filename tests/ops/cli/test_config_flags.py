"""`local up`'s flags are made from StackConfig's fields (cli.config_flags): the flags and the
config cannot drift, a default given by no flag is the field's, and the parser refuses exactly
what the field refuses, naming the flag."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from dflash_ops.cli import build_parser
from dflash_ops.cli.config_flags import config_from_flags, flag_of, flagged_fields
from dflash_ops.cli.local import CLI_OWNED
from dflash_ops.errors import UserError
from dflash_ops.local.stack_config import StackConfig
from pydantic import ValidationError

FLAGGED = flagged_fields(StackConfig, CLI_OWNED)


def up(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["local", "up", *flags])


def test_every_field_the_user_sets_has_its_flag_and_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        up("--help")
    help_text = " ".join(capsys.readouterr().out.split())
    for name in FLAGGED:
        field = StackConfig.model_fields[name]
        assert f"{flag_of(name, field)} " in help_text, name
        assert field.description, f"StackConfig.{name} needs a description: it is the help"
    # The fields left without a flag are the ones the stack sets itself.
    assert set(StackConfig.model_fields) - set(FLAGGED) == {
        "state_dir", "auth", "kv_cache_gib", "scale_out", "kv_events_port", "engine_threads",
        "sidecar_scrape_interval",
    }  # fmt: skip


def test_no_flag_given_is_the_configs_default(tmp_path: Path) -> None:
    args = up("--state-dir", str(tmp_path))
    config = config_from_flags(StackConfig, args, FLAGGED, "local up", state_dir=tmp_path)
    assert config == StackConfig(state_dir=tmp_path)


def test_flags_reach_their_fields(tmp_path: Path) -> None:
    args = up("--k", "6", "--schedule", "1-2:6,3-:2", "--no-prometheus", "--engine-timeout",
              "30", "--router-policy", "round_robin", "--replicas", "2", "--enforce-eager",
              "--baseline", "b.json", "--draft-noise", "0.5")  # fmt: skip
    config = config_from_flags(StackConfig, args, FLAGGED, "local up", state_dir=tmp_path)
    assert (config.num_speculative_tokens, config.schedule) == (6, ((1, 2, 6), (3, 65536, 2)))
    assert not config.prometheus and config.engine_timeout_s == 30.0
    assert (config.router_policy, config.replicas, config.enforce_eager) == ("round_robin", 2, True)
    assert config.baseline == Path("b.json") and config.draft_noise == 0.5


@pytest.mark.parametrize(
    "name",
    [n for n in FLAGGED if any(hasattr(m, "le") for m in StackConfig.model_fields[n].metadata)],
)
def test_the_parser_refuses_what_the_field_refuses(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    field = StackConfig.model_fields[name]
    flag = flag_of(name, field)
    assert flag is not None
    bounds = {k: getattr(m, k) for m in field.metadata for k in ("ge", "gt", "le")
              if getattr(m, k, None) is not None}  # fmt: skip
    low = bounds.get("ge", bounds.get("gt"))
    outside = [bounds["le"] + 1] + ([low - 1] if "ge" in bounds else [low])
    for value in outside:
        with pytest.raises(ValidationError):
            StackConfig(**{name: value})
        with pytest.raises(SystemExit):
            up(flag, str(value))
        assert f"argument {flag}:" in capsys.readouterr().err
    config = config_from_flags(StackConfig, up(flag, str(bounds["le"])), FLAGGED, "local up")
    assert getattr(config, name) == bounds["le"]


def test_a_value_only_the_config_refuses_is_one_line_naming_the_command() -> None:
    with pytest.raises(UserError, match=r"^local up: schedule '1-2:4,3-:5': range 3-65536"):
        config_from_flags(StackConfig, up("--schedule", "1-2:4,3-:5"), FLAGGED, "local up")
