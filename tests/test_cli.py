"""The command line on the default model, as a user runs it (error paths: test_gguf_errors.py)."""

import subprocess
import sys

import pytest
from real_models import real_model_path

CLI = [sys.executable, "-c", "from llcinfer.cli import main; main()"]


def run(*args, stdin=None, timeout=600):
    return subprocess.run(CLI + list(args), input=stdin, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def smollm2():
    return real_model_path("smollm2-135m")


def test_version_and_help():
    out = run("--version")
    assert out.returncode == 0 and "llcinfer" in out.stdout and "0." in out.stdout
    helped = run("generate", "--help")
    for opt in ("--max-tokens", "--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--seed",
                "--threads", "--ignore-eos", "--chat", "--verbose"):
        assert opt in helped.stdout


def test_generate_greedy_matches_api_and_stdin(smollm2):
    from llcinfer import LLM

    expected = LLM(smollm2, threads=1).generate("The capital of France is", max_tokens=12, temperature=0)
    out = run("generate", "-m", smollm2, "--temp", "0", "-n", "12", "-t", "1", "The capital of France is")
    assert out.returncode == 0, out.stderr
    assert out.stdout == expected + "\n"
    piped = run("generate", "-m", smollm2, "--temp", "0", "-n", "12", "-t", "1", "-", stdin="The capital of France is")
    assert piped.stdout == out.stdout


def test_generate_verbose_chat_and_seed(smollm2):
    out = run("generate", "-m", smollm2, "--chat", "--verbose", "-n", "16", "--seed", "3", "Say hello.")
    assert out.returncode == 0, out.stderr
    assert "<|im_" not in out.stdout
    assert "tok/s" in out.stderr and "TPOT" in out.stderr
    again = run("generate", "-m", smollm2, "--chat", "-n", "16", "--seed", "3", "Say hello.")
    assert again.stdout == out.stdout  # same seed, same text


def test_models_listing_names_the_catalog(smollm2):
    out = run("models")
    assert out.returncode == 0
    for name in ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        assert name in out.stdout
    path = run("models", "path", "smollm2-135m")
    assert path.returncode == 0 and path.stdout.strip() == smollm2


def test_chat_session_commands(smollm2):
    script = "Hi!\n/reset\n/bogus\nName a fruit.\n/exit\n"
    out = run("chat", "-m", smollm2, "-n", "12", "--temp", "0", stdin=script)
    assert out.returncode == 0, out.stderr
    assert "(history cleared)" in out.stderr
    assert "unknown command /bogus" in out.stderr
    assert out.stderr.count("tok/s") >= 2  # speed after each reply
    assert len([line for line in out.stdout.splitlines() if line.strip()]) >= 2


def test_chat_ends_on_eof(smollm2):
    out = run("chat", "-m", smollm2, "-n", "4", stdin="")
    assert out.returncode == 0
