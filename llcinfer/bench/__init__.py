"""``llcinfer bench``: TPOT side by side with llama.cpp (the machine it ran on: hw/).

    llama_cpp    provisioning llama.cpp builds (native, portable) from the pinned sources: the
                 toolchain and build; re-exports llama_cpp_config (constants, paths, CMake
                 options per CPU) and llama_cpp_source (source tree, sdist download, extraction)
    llama_bench  running llama-bench, parsing its JSON, crash/failure detection; versions
    ours         our side: llama-bench's method (warm-up, repetitions, depth filled untimed)
    compare      the alternating A B A B loop over models, threads and tests
    report       records, mean ± std, TPOT ratio, roofline fraction, table, JSON
    plot         TPOT against KV depth (matplotlib, the ``perf`` extra)
"""
