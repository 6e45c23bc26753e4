"""Regenerate the golden tokenizer fixtures from llama.cpp's ``llama-tokenize``.

For every string of ``tests/fixtures/tokenizer_corpus.json`` and each model, runs

    llama-tokenize -m MODEL -f TEXTFILE --ids --log-disable --no-escape [--no-parse-special]

(the file is read verbatim; escapes are not processed; BOS follows the model's default) and
writes ``{"model", "llama_cpp", "records": [{"text", "special", "ids"}, ...]}`` to
``tests/fixtures/tokenizer_golden_<vocab>.json``.  The tests only read those JSON files and the
model files, so llama.cpp is needed only to regenerate them.

    python perf/make_tokenizer_golden.py [--llama-tokenize PATH] [--compare]

``--compare`` also prints how many records llcinfer's tokenizer reproduces.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
HOME = os.environ.get("LLCINFER_HOME", os.path.expanduser("~/.cache/llcinfer"))
# fixture name -> model file name (in $LLCINFER_HOME/models)
MODELS = {"smollm": "smollm2-135m", "qwen2": "qwen2.5-coder-0.5b"}


def find_llama_tokenize() -> str | None:
    """The first ``llama-tokenize`` binary under $LLCINFER_HOME/llama.cpp, if any."""
    for pattern in ("llama.cpp/*/bin/llama-tokenize", "llama.cpp/*/build/bin/llama-tokenize",
                    "llama.cpp/**/bin/llama-tokenize"):
        hits = sorted(glob.glob(os.path.join(HOME, pattern), recursive=True))
        if hits:
            return hits[0]
    return None


def tokenize(binary: str, model: str, text: str, special: bool, workdir: str) -> list[int]:
    """Token ids llama.cpp produces for ``text`` (verbatim bytes, model-default BOS)."""
    path = os.path.join(workdir, "prompt.txt")
    with open(path, "wb") as fh:
        fh.write(text.encode("utf-8"))
    cmd = [binary, "-m", model, "-f", path, "--ids", "--log-disable", "--no-escape"]
    if not special:
        cmd.append("--no-parse-special")
    proc = subprocess.run(cmd, capture_output=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-tokenize failed ({proc.returncode}) for {text!r}: "
                           f"{proc.stderr.decode(errors='replace')[-400:]}")
    lines = [ln for ln in proc.stdout.decode().splitlines() if ln.startswith("[")]
    if not lines:
        raise RuntimeError(f"no id list in llama-tokenize output for {text!r}: {proc.stdout[-300:]!r}")
    return json.loads(lines[-1])


def llama_cpp_version(binary: str) -> str:
    """Best-effort version string of the llama.cpp build (``--version``)."""
    try:
        proc = subprocess.run([binary, "--version"], capture_output=True, timeout=30)
        out = (proc.stdout + proc.stderr).decode(errors="replace").strip().splitlines()
        return next((ln for ln in out if "version" in ln), out[0] if out else "unknown")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def compare(fixture: str, model_path: str) -> None:
    """Print how many golden records llcinfer's tokenizer reproduces."""
    sys.path.insert(0, ROOT)
    from llcinfer.model.gguf_file import GGUFFile
    from llcinfer.model.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(GGUFFile(model_path).metadata)
    with open(fixture, encoding="utf-8") as fh:
        records = json.load(fh)["records"]
    bad = [r for r in records if tok.encode(r["text"], special=r["special"]) != r["ids"]]
    print(f"  llcinfer agrees on {len(records) - len(bad)}/{len(records)} records")
    for r in bad[:10]:
        print(f"    MISMATCH special={r['special']} {r['text']!r}\n      llama.cpp {r['ids']}\n"
              f"      llcinfer  {tok.encode(r['text'], special=r['special'])}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-tokenize", default=None, help="path of llama.cpp's llama-tokenize binary")
    ap.add_argument("--only", choices=sorted(MODELS), help="regenerate one vocabulary only")
    ap.add_argument("--compare", action="store_true", help="check llcinfer's tokenizer against the result")
    args = ap.parse_args(argv)

    binary = args.llama_tokenize or find_llama_tokenize()
    if not binary or not os.access(binary, os.X_OK):
        print(f"llama-tokenize not found (looked under {HOME}/llama.cpp); pass --llama-tokenize", file=sys.stderr)
        return 2
    with open(os.path.join(FIXTURES, "tokenizer_corpus.json"), encoding="utf-8") as fh:
        corpus = json.load(fh)
    version = llama_cpp_version(binary)
    for vocab, name in MODELS.items():
        if args.only and vocab != args.only:
            continue
        model = os.path.join(HOME, "models", name + ".gguf")
        if not os.path.exists(model):
            print(f"skip {vocab}: {model} missing", file=sys.stderr)
            continue
        records = []
        with tempfile.TemporaryDirectory() as work:
            for text in corpus:
                for special in (False, True):
                    records.append({"text": text, "special": special,
                                    "ids": tokenize(binary, model, text, special, work)})
        out = os.path.join(FIXTURES, f"tokenizer_golden_{vocab}.json")
        tmp = out + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            head = json.dumps({"model": name, "llama_cpp": version}, ensure_ascii=False)[:-1]
            body = ",\n".join(json.dumps(r, ensure_ascii=False) for r in records)
            fh.write(f'{head}, "records": [\n{body}\n]}}\n')  # one record per line
        os.replace(tmp, out)
        print(f"{vocab}: wrote {len(records)} records to {os.path.relpath(out, ROOT)}")
        if args.compare:
            compare(out, model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
