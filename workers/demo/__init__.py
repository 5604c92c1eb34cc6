"""`bcw demo` and what names a hang of it: may use the registry, the simulator, the
embedded servers, the runtime and `schemas` — never the CLI or the benchmarks."""
