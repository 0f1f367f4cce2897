from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pytest
from dflash_ops.cli import main


def test_version_matches_distribution(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"dflash-serve {version('dflash-serve')}"


def test_help_names_the_program(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "usage: dflash-serve" in capsys.readouterr().out


def test_unknown_subcommand_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["no-such-command"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "--base-url", "ftp://x:1"], "expected http:// or https://"),
        (["bench", "--base-url", "http://127.0.0.1:99999"], "the port is not a number"),
        (["bench", "--repeats", "0"], "argument --repeats: '0': must be from 1 to 1000"),
        (["bench", "--concurrency", "a,b"], "'a' is not a whole number"),
        (["bench", "--concurrency", "1", "--request-rate", "2"], "not allowed with argument"),
        (["bench", "--request-rate", "inf"], "--request-rate inf sends every request at once"),
        (["bench", "--num-prompts", "2"], "a run would get no request; give at least 3"),
        (["bench", "--prompts", "fixed", "--random-prefix-len", "3"], "random only, not fixed"),
        (["bench", "--out", "/proc/no-such-dir"], "--out /proc/no-such-dir: cannot write"),
        (["bench", "compare", "/no/such/dir", "/no/such/dir"], "/no/such/dir not found"),
        (["bench", "--no-such-flag"], "unknown option --no-such-flag"),
        (["bench", "--no-such-flag", "3"], "unknown option --no-such-flag"),
        (["bench", "--random-output-lenn", "3"], "(did you mean --random-output-len?)"),
        (["bench", "sweep", "--nope=1"], "bench sweep: error: unknown option --nope"),
        (["local", "up", "--k", "99"], "--k: '99': must be from 1 to 15"),
        (
            ["local", "up", "--engine-port", "70000"],
            "--engine-port: '70000': must be from 1 to 65535",
        ),
        (["local", "up", "--engine-timeout", "0"], "--engine-timeout: '0': must be above 0"),
        (["local", "up", "--router-policy", "kv_aware"], "--router-policy: invalid choice"),
        (["sidecar", "--scrape-interval", "-1"], "scrape_interval"),
    ],
)
def test_garbage_flags_get_one_line_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err and "Traceback" not in err


def test_compare_accepts_a_directory_and_names_a_foreign_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "results.json").write_text('{"not": "a benchmark"}')
    assert main(["bench", "compare", str(tmp_path), str(tmp_path)]) == 2
    assert "is not a dflash-serve results.json" in capsys.readouterr().err


def test_sidecar_help_lists_every_setting_with_unit_default_and_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dflash_sidecar.settings import settings_spec

    with pytest.raises(SystemExit):
        main(["sidecar", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for setting in settings_spec():
        assert setting.variable in text, setting.name
        # The API key has no flag: arguments show in the process list and the pod spec.
        assert (setting.flag in text) == setting.has_flag, setting.name
    assert "[s; default 2.0; DFLASH_SIDECAR_SCRAPE_INTERVAL]" in text
    assert "--api-key" not in text and "VLLM_API_KEY" in text
