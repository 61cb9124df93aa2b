"""`radixlm bench` on bad input: flag values, dataset files, unreachable or locked
servers, served names without a local tokenizer, and requests that all fail. The
server is tests/bench/fake_server.py (no model); prompts use the bundled tokenizer."""

from __future__ import annotations

import json
import socket

import pytest
import transformers

from radixlm.cli import main as radixlm_main
from radixlm.runtime.executor.model_registry import local_hf_dir
from tests.bench.fake_server import FakeConfig, FakeServer

FAST = ["--num-prompts", "2", "--random-input-len", "8", "--random-output-len", "3"]


def bench(capsys, *argv: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `radixlm bench ARGV` run in this process."""
    try:
        code = radixlm_main(["bench", "--disable-tqdm", *argv])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def offline_tokenizers(monkeypatch):
    """Every AutoTokenizer.from_pretrained call's (name, local_files_only); a call that
    could download raises OSError at once (this machine has no internet)."""
    real = transformers.AutoTokenizer.from_pretrained
    calls: list[tuple[str, bool]] = []

    def spy(name, *args, **kwargs):
        calls.append((str(name), kwargs.get("local_files_only", False)))
        if not kwargs.get("local_files_only"):
            raise OSError(f"would try to download {name} from huggingface.co")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", spy)
    return calls


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--num-prompts", "0", "must be at least 1, got 0"),
        ("--num-prompts", "-3", "must be at least 1, got -3"),
        ("--num-prompts", "two", "expected an integer, got 'two'"),
        ("--random-input-len", "0", "must be at least 1, got 0"),
        ("--random-output-len", "0", "must be at least 1, got 0"),
        ("--random-range-ratio", "1.5", "must be between 0 and 1, got 1.5"),
        ("--random-range-ratio", "-0.1", "must be between 0 and 1, got -0.1"),
        ("--gsp-num-groups", "0", "must be at least 1, got 0"),
        ("--gsp-prompts-per-group", "0", "must be at least 1, got 0"),
        ("--gsp-system-prompt-len", "-1", "must be at least 0, got -1"),
        ("--gsp-question-len", "-5", "must be at least 0, got -5"),
        ("--gsp-output-len", "0", "must be at least 1, got 0"),
        ("--multi-turn-num-turns", "0", "must be at least 1, got 0"),
        ("--multi-turn-system-len", "-1", "must be at least 0, got -1"),
        ("--multi-turn-turn-len", "-1", "must be at least 0, got -1"),
        ("--multi-turn-output-len", "0", "must be at least 1, got 0"),
        ("--sharegpt-output-len", "0", "must be at least 1, got 0"),
        ("--request-rate", "0", "must be > 0 (or inf: all at once), got 0"),
        ("--request-rate", "-2", "must be > 0 (or inf: all at once), got -2"),
        ("--request-rate", "nan", "expected a number, got 'nan'"),
        ("--max-concurrency", "0", "must be at least 1, got 0"),
        ("--sweep-rate", "1,0,4", "must be > 0 (or inf: all at once), got 0"),
        ("--sweep-rate", ",", "expected rates separated by commas, got ','"),
        ("--sweep-rate", "1,x", "expected a number, got 'x'"),
        ("--slo-ttft-ms", "0", "must be a finite number > 0, got 0"),
        ("--slo-tpot-ms", "-10", "must be a finite number > 0, got -10"),
        ("--slo-tpot-ms", "inf", "must be a finite number > 0, got inf"),
    ],
)
def test_nonsense_numbers_are_argument_errors(capsys, flag, value, message):
    code, out, err = bench(capsys, "--base-url", closed_port_url(), f"{flag}={value}")
    assert code == 2
    assert f"radixlm bench: error: argument {flag}: {message}" in err
    assert out == ""


def test_sensible_edge_values_parse():
    import argparse

    from radixlm.bench.cli import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(
        ["--request-rate", "inf", "--random-range-ratio", "0", "--gsp-question-len", "0",
         "--multi-turn-system-len", "0", "--sweep-rate", "0.5, 2,inf", "--num-prompts", "1",
         "--slo-ttft-ms", "0.5"]
    )  # fmt: skip
    assert args.request_rate == float("inf") and args.random_range_ratio == 0.0
    assert args.gsp_question_len == 0 and args.multi_turn_system_len == 0
    assert args.sweep_rate == "0.5, 2,inf" and args.num_prompts == 1
    assert args.slo_ttft_ms == 0.5 and args.max_concurrency is None


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--dataset-name", "generated-shared-prefix", "--gsp-system-prompt-len", "0",
          "--gsp-question-len", "0"], "--gsp-question-len are both 0"),
        (["--dataset-name", "multi-turn", "--multi-turn-system-len", "0",
          "--multi-turn-turn-len", "0"], "--multi-turn-turn-len are both 0"),
        (["--dataset-name", "sharegpt"], "--dataset-name sharegpt needs --dataset-path"),
    ],
)  # fmt: skip
def test_empty_prompts_are_errors_before_the_server_is_contacted(capsys, flags, message):
    code, _, err = bench(capsys, "--base-url", closed_port_url(), *flags)
    assert code == 2
    assert message in err and "cannot reach" not in err


def _bad_dataset_files(tmp_path):
    files = {
        "not.json": ("conversations: none", "is not valid JSON (Expecting value at line 1"),
        "object.json": ('{"conversations": []}', "is not a JSON list; expected a JSON list of"),
        "strings.json": ('["a", "b"]', "has no conversation with two text turns among its 2"),
        "novalue.json": (
            json.dumps([{"conversations": [{"from": "human"}, {"from": "gpt"}]}]),
            "has no conversation with two text turns among its 1",
        ),
        "binary.json": (b"\xff\xfe\x00[", "is not UTF-8 text"),
    }
    out = []
    for name, (content, message) in files.items():
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        out.append((str(path), message))
    out.append((str(tmp_path / "missing.json"), "does not exist"))
    out.append((str(tmp_path), "is a directory"))
    return out


def test_bad_dataset_files_are_one_line_errors(capsys, tmp_path):
    url = closed_port_url()  # the file is checked before the server
    for path, message in _bad_dataset_files(tmp_path):
        code, _, err = bench(capsys, "--base-url", url, "--dataset-name", "sharegpt",
                             "--dataset-path", path)  # fmt: skip
        assert code == 2, (path, err)
        assert err.startswith(f"radixlm: error: dataset file {path!r} "), err
        assert message in err, err
        assert err.count("\n") == 1 and "Traceback" not in err


def test_nonexistent_dataset_path_is_named(capsys):
    code, _, err = bench(capsys, "--dataset-name", "sharegpt", "--dataset-path", "/nonexistent")
    assert (code, err) == (2, "radixlm: error: dataset file '/nonexistent' does not exist\n")


def test_unreachable_server_is_an_error_before_the_workload(capsys, offline_tokenizers):
    url = closed_port_url()
    code, out, err = bench(capsys, "--base-url", url, *FAST)
    assert code == 2
    assert err == f"radixlm: error: cannot reach {url}: Connection refused\n"
    assert "Failed requests" not in out
    assert offline_tokenizers == []  # nothing loaded for a dead server


@pytest.mark.parametrize("backend", ["radixlm", "openai"])
def test_missing_or_wrong_api_key_is_reported(capsys, backend):
    cfg = FakeConfig(api_key="sesame")
    with FakeServer(cfg) as url:
        code, out, err = bench(capsys, "--backend", backend, "--base-url", url, *FAST,
                               "--tokenizer", "smollm2-135m")  # fmt: skip
        assert code == 2
        assert err == (
            f"radixlm: error: {url} refused the request: HTTP 401: Incorrect or missing "
            "API key (pass --api-key)\n"
        )
        code, _, err = bench(capsys, "--backend", backend, "--base-url", url, *FAST,
                             "--api-key", "wrong", "--tokenizer", "smollm2-135m")  # fmt: skip
        assert code == 2 and "HTTP 401" in err and "(check --api-key)" in err
        code, out, err = bench(capsys, "--backend", backend, "--base-url", url, *FAST,
                               "--api-key", "sesame", "--tokenizer", "smollm2-135m")  # fmt: skip
    assert (code, err) == (0, "")
    assert "Successful requests                        2" in out
    assert [p["path"] for p in cfg.posts] == 2 * [
        "/generate" if backend == "radixlm" else "/v1/completions"
    ]


def test_every_failed_request_reports_why(capsys, tmp_path):
    cfg = FakeConfig(fail_status=500)
    report = tmp_path / "report.json"
    with FakeServer(cfg) as url:
        code, out, err = bench(capsys, "--base-url", url, *FAST, "--tokenizer", "smollm2-135m",
                               "--output-json", str(report))  # fmt: skip
    assert code == 1
    assert "Failed requests                            2" in out
    assert "Failed requests by error:\n     2 x HTTP 500: model exploded\n" in out
    assert err == "radixlm bench: all 2 requests failed; error: HTTP 500: model exploded\n"
    summary = json.loads(report.read_text())["summary"]
    assert summary["error_counts"] == {"HTTP 500: model exploded": 2}


@pytest.mark.parametrize("model_flag", [[], ["--model", "my-model"]])
def test_served_name_without_local_tokenizer_asks_for_tokenizer(
    capsys, offline_tokenizers, model_flag
):
    cfg = FakeConfig(models=[{"id": "my-model", "root": "/nonexistent/my-model"}])
    with FakeServer(cfg) as url:
        code, out, err = bench(capsys, "--backend", "openai", "--base-url", url, *FAST,
                               *model_flag)  # fmt: skip
    assert code == 2
    assert err.startswith("radixlm: error: no local tokenizer 'my-model': not a radixlm model")
    assert "no local tokenizer '/nonexistent/my-model'" in err
    assert err.endswith("; pass --tokenizer with a local Hugging Face directory, a .gguf "
                        "file or a radixlm model alias such as smollm2-135m\n")  # fmt: skip
    assert err.count("\n") == 1 and out == ""
    assert offline_tokenizers and all(local for _, local in offline_tokenizers)
    assert cfg.posts == []  # no request was sent


def test_openai_backend_needs_a_model_name(capsys):
    with FakeServer(FakeConfig(models=[])) as url:
        code, _, err = bench(capsys, "--backend", "openai", "--base-url", url, *FAST)
    assert (code, err) == (
        2,
        f"radixlm: error: no model name in {url}/v1/models; pass --model NAME\n",
    )


def test_explicit_tokenizer_that_is_not_local(capsys, offline_tokenizers):
    with FakeServer(FakeConfig()) as url:
        code, _, err = bench(capsys, "--base-url", url, *FAST, "--tokenizer", "org/not-cached")
    assert code == 2
    assert err.startswith("radixlm: error: --tokenizer: no local tokenizer 'org/not-cached'")
    assert offline_tokenizers == [("org/not-cached", True)]


def test_served_name_falls_back_to_the_reported_root(capsys, offline_tokenizers, tmp_path):
    root = str(local_hf_dir("smollm2-135m"))
    cfg = FakeConfig(models=[{"id": "my-model", "root": root}])
    report = tmp_path / "report.json"
    with FakeServer(cfg) as url:
        code, out, err = bench(capsys, "--backend", "openai", "--base-url", url, *FAST,
                               "--output-json", str(report))  # fmt: skip
    assert (code, err) == (0, "")
    assert offline_tokenizers == [("my-model", True), (root, True)]
    assert [p["model"] for p in cfg.posts] == ["my-model", "my-model"]
    assert [p["max_tokens"] for p in cfg.posts] == [3, 3]
    s = json.loads(report.read_text())["summary"]
    assert s["completed"] == 2 and s["output_tokens"] == 6 and s["error_counts"] == {}


def test_help_says_how_the_tokenizer_is_chosen(capsys):
    code, out, _ = bench(capsys, "--help")
    assert code == 0
    text = " ".join(out.split())
    assert "never downloaded" in text
    assert "the first name the server lists in /v1/models" in text
    assert "--model, else smollm2-135m" not in text
