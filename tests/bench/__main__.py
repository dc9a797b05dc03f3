"""``make bench``: run every tests/bench/bench_*.py ``main()``; each prints ``name: value unit`` lines."""

import importlib
import pkgutil
import sys

import tests.bench as bench


def main(names: list[str]) -> int:
    for module in sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_")):
        if names and module not in names:
            continue
        print(f"# {module}", flush=True)
        importlib.import_module(f"tests.bench.{module}").main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
