"""One fresh process of `models --first-call`: the cost of a method's first call on a new shape.

    python -m sageattention.bench.first_call MODEL METHOD     # prints one JSON line of seconds

Times `import torch`, then `import sageattention`, then (after making the inputs and starting CUDA, untimed) the
method's first call up to synchronize: what a running model pays the first time it meets the shape (JIT compiles,
autotuning, library loading). Nothing but the standard library is imported before the clock starts.
"""
import argparse
import json
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sageattention.bench.first_call",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("method")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    import torch
    torch_done = time.perf_counter()
    import sageattention  # noqa: F401  (timed apart from the call)
    sage_done = time.perf_counter()

    from sageattention.bench.workloads import METHODS, MODELS, inputs, methods, pinned

    if args.model not in MODELS or args.method not in METHODS:
        ap.error(f"unknown model {args.model!r} or method {args.method!r}; models: {', '.join(MODELS)}; "
                 f"methods: {', '.join(METHODS)}")
    m = MODELS[args.model]
    call = methods(m, *inputs(m))[args.method]
    torch.cuda.synchronize()
    with pinned(call):
        call_start = time.perf_counter()
        call()
        torch.cuda.synchronize()
    print(json.dumps(dict(import_torch_s=torch_done - start, import_sageattention_s=sage_done - torch_done,
                          first_call_s=time.perf_counter() - call_start)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
