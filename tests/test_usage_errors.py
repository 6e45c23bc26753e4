"""Bad arguments (the model file is good): LLM and the command line.

Each case asserts the exception type from ``llcinfer.errors`` and that the message names
the problem; for the CLI, the exit code (2 usage, 1 runtime), exactly one ``error:`` line
on stderr and no traceback.  Bad model files: test_gguf_errors.py.
"""

import pytest

from llcinfer.errors import ContextLengthError, UsageError
from llcinfer.model.catalog import DEFAULT_MODEL

from cli_run import assert_one_error_line, run_cli, run_main
from tiny_models import isolated_runtime, write_tiny_model


@pytest.fixture(scope="module", autouse=True)
def _runtime(tmp_path_factory):
    with isolated_runtime(tmp_path_factory.mktemp("llcinfer_home")):
        yield


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return {"good": write_tiny_model(tmp_path_factory.mktemp("tiny") / "good.gguf", "llama", "Q8_0")}


def test_llm_bad_arguments(files):
    from llcinfer import LLM

    for threads in (0, -1, 1.5, "2"):
        with pytest.raises(UsageError, match="threads"):
            LLM(str(files["good"]), threads=threads)
    for n_ctx in (0, -5):
        with pytest.raises(UsageError, match="n_ctx"):
            LLM(str(files["good"]), threads=1, n_ctx=n_ctx)
    llm = LLM(str(files["good"]), threads=1, n_ctx=4)
    with pytest.raises(ContextLengthError, match="context length 4"):
        llm.generate("hello the world and more words", max_tokens=1)
    with pytest.raises(UsageError, match="token ids"):
        llm.logits([300])
    with pytest.raises(UsageError):
        llm.logits([])
    with pytest.raises(UsageError, match="unknown sampling option"):
        llm.generate("hi", temprature=0)
    with pytest.raises(UsageError, match="top_p"):
        llm.generate("hi", top_p=0)


@pytest.mark.parametrize("args,fragment", [
    (["--temp", "-1"], "temperature"),
    (["--top-p", "0"], "top_p"),
    (["--top-p", "1.5"], "top_p"),
    (["-n", "-1"], "max_tokens"),
    (["--min-p", "2"], "min_p"),
    (["--temp", "abc"], "abc"),
    (["--bogus-option"], "bogus"),
    (["--sparse", "--sparse-top-k", "0"], "sparse_top_k"),
    (["--sparse", "--sparse-top-k", "-3"], "sparse_top_k"),
    (["--sparse", "--sparse-top-k", "abc"], "abc"),
    (["--sparse-top-k", "64"], "needs sparse"),
    (["--sparse", "--sparse-indexers", "0"], "sparse_indexers"),
    (["--sparse-indexers", "4"], "needs sparse"),
])
def test_cli_usage_errors(files, args, fragment):
    proc = run_cli("generate", "-m", files["good"], *args, "hi")
    assert_one_error_line(proc, 2, fragment)


def test_cli_threads_zero(files):
    assert_one_error_line(run_cli("generate", "-m", files["good"], "--threads", "0", "hi"), 2, "threads")


def test_cli_unknown_catalog_name():
    proc = run_cli("generate", "-m", "no-such-model-xyz", "hi")
    assert_one_error_line(proc, 2, "no-such-model-xyz", DEFAULT_MODEL)


def test_cli_prompt_over_context_length(files):
    proc = run_cli("generate", "-m", files["good"], "-c", "4", "--temp", "0", "hello the world " * 8)
    assert_one_error_line(proc, 1, "context length 4")


def test_cli_input_errors_come_before_the_kernels(files, tmp_path, monkeypatch, capsys):
    """A prompt longer than the context and a text too short to score fail on the model
    file alone: no LLM is built (in a fresh home that compiles and calibrates the kernels
    for minutes before the input is looked at)."""
    import llcinfer.api

    def no_llm(*args, **kwargs):
        raise AssertionError("the LLM was built before the input was checked")

    monkeypatch.setattr(llcinfer.api.LLM, "__init__", no_llm)
    rc, _, err = run_main(capsys, "generate", "-m", files["good"], "-c", "4", "--temp", "0", "hello the world " * 8)
    assert rc == 1 and err.startswith("error: prompt of ") and "exceeds the context length 4" in err, err
    short = tmp_path / "short.txt"
    short.write_text("a b c")
    rc, _, err = run_main(capsys, "perplexity", "-m", files["good"], "-f", short, "-c", "16")
    assert rc == 2 and "-c 16 needs at least 32" in err, err


def test_llm_takes_an_opened_model_file(files):
    from llcinfer import LLM
    from llcinfer.model.model_file import ModelFile

    source = ModelFile(files["good"])
    llm = LLM(source, threads=1, n_ctx=32)
    try:
        assert llm.file is source and llm.tokenizer is source.tokenizer
        prompt = "hello the world"
        by_path = LLM(str(files["good"]), threads=1, n_ctx=32)
        try:
            assert llm.generate(prompt, max_tokens=6, temperature=0) == by_path.generate(prompt, max_tokens=6,
                                                                                         temperature=0)
        finally:
            by_path.close()
    finally:
        llm.close()


def test_cli_prompt_as_argument_or_option(files, capsys):
    """-p PROMPT (llama.cpp's spelling) does what the PROMPT argument does; both, or
    neither, is a usage error (in this process: its kernels are built)."""
    args = ("generate", "-m", files["good"], "-t", "1", "-n", "3", "--temp", "0", "--ignore-eos")
    flag, positional = run_main(capsys, *args, "-p", "hello"), run_main(capsys, *args, "hello")
    assert flag[0] == 0 and flag[1].endswith("\n"), flag
    assert flag[:2] == positional[:2]
    for extra in (("-p", "hello", "hello"), ()):
        rc, _, err = run_main(capsys, *args, *extra)
        assert rc == 2 and err.startswith("error:") and "prompt once" in err and len(err.splitlines()) == 1, err


def test_cli_generate_works_on_tiny_model(files):
    """The error cases above are not an artefact of a CLI that always fails."""
    proc = run_cli("generate", "-m", files["good"], "-n", "3", "--temp", "0", "--ignore-eos", "hello")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("\n")
    assert "error" not in proc.stderr
