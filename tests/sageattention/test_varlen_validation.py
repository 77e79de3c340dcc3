"""sageattn_varlen's cu_seqlens / max_seqlen: bad ones raise an error naming the entry before any kernel runs
(unchecked, they crashed the process or left rows of the output unwritten); valid ones, empty sequences
included, give per-sequence attention."""
import warnings

import pytest
import torch

import sageattention as sa
from sageattention import inputs
from tests.sageattention.helpers import DEVICE, check_per_sequence, cu_seqlens, packed_varlen

HQ, HK, D = 4, 2, 32


def packed(lens_q, lens_k, seed=0, cu_dtype=torch.int32):
    return packed_varlen(lens_q, lens_k, hq=HQ, hk=HK, d=D, seed=seed, cu_dtype=cu_dtype)


def t(*values, dtype=torch.int32):
    return torch.tensor(values, dtype=dtype, device=DEVICE)


# ---------------------------------------------------------------- bad arguments

# The base call: two sequences, 4 + 6 tokens for q and k, max_seqlen 6.
BAD = {  # name -> (argument overrides, exception, message pattern)
    "cu_list": ({"cu_q": [0, 4, 10]}, TypeError, r"cu_seqlens_q must be a torch.Tensor.*got list"),
    "cu_float": ({"cu_k": t(0, 4, 10, dtype=torch.float32)}, TypeError, r"cu_seqlens_k has dtype torch.float32"),
    "cu_2d": ({"cu_q": t(0, 4, 10)[None]}, ValueError, r"cu_seqlens_q must be a 1-D.*shape \(1, 3\)"),
    "cu_one_entry": ({"cu_q": t(0), "cu_k": t(0)}, ValueError, r"cu_seqlens_q must be a 1-D.*shape \(1,\)"),
    "cu_counts_differ": ({"cu_k": t(0, 10)}, ValueError, r"describe 2 and 1 sequences"),
    "cu_other_device": ({"cu_k": t(0, 4, 10).to("meta")}, ValueError, r"cu_seqlens_k is on meta but q is on"),
    # today: a segfault / abort in free()
    "first_negative": ({"cu_q": t(-5, 4, 10)}, ValueError, r"cu_seqlens_q\[0\] is -5; it must be 0"),
    "first_positive_k": ({"cu_k": t(2, 4, 10)}, ValueError, r"cu_seqlens_k\[0\] is 2; it must be 0"),
    "last_past_q": ({"cu_q": t(0, 4, 12)}, ValueError,
                    r"cu_seqlens_q\[2\] \(the last entry\) is 12, but q has 10 tokens"),
    "last_past_k": ({"cu_k": t(0, 4, 4000, dtype=torch.int64)}, ValueError,
                    r"cu_seqlens_k\[2\] \(the last entry\) is 4000, but k has 10 tokens"),
    # today: rows of uninitialized memory in the output
    "last_short_q": ({"cu_q": t(0, 4, 8)}, ValueError, r"cu_seqlens_q\[2\] \(the last entry\) is 8, but q has 10"),
    "last_short_k": ({"cu_k": t(0, 4, 9)}, ValueError, r"cu_seqlens_k\[2\] \(the last entry\) is 9, but k has 10"),
    "max_seqlen_q_short": ({"max_q": 5}, ValueError,
                           r"max_seqlen_q=5 is less than the longest sequence: sequence 1 has 6 queries"),
    "max_seqlen_k_short": ({"max_k": 3}, ValueError,
                           r"max_seqlen_k=3 is less than the longest sequence: sequence 1 has 6 keys"),
    # today: finite garbage
    "decreasing_q": ({"cu_q": t(0, 7, 5, 10), "cu_k": t(0, 3, 6, 10)}, ValueError,
                     r"cu_seqlens_q must be non-decreasing.*cu_seqlens_q\[2\] = 5 is less than cu_seqlens_q\[1\] = 7"),
    "decreasing_k": ({"cu_k": t(0, 6, 2, 10, 10), "cu_q": t(0, 2, 4, 6, 10)}, ValueError,
                     r"cu_seqlens_k\[2\] = 2 is less than cu_seqlens_k\[1\] = 6"),
    "max_seqlen_q_zero": ({"max_q": 0}, ValueError, r"max_seqlen_q must be a positive int, got 0"),
    "max_seqlen_k_float": ({"max_k": 6.5}, TypeError, r"max_seqlen_k must be an int, got float"),
    "max_seqlen_q_bool": ({"max_q": True}, TypeError, r"max_seqlen_q must be an int, got bool"),
    "max_seqlen_k_tensor": ({"max_k": t(6)}, TypeError, r"max_seqlen_k must be an int, got Tensor"),
}


def _base():
    q, k, v, cu_q, cu_k = packed([4, 6], [4, 6])
    return {"q": q, "k": k, "v": v, "cu_q": cu_q, "cu_k": cu_k, "max_q": 6, "max_k": 6}


def _call(a):
    return sa.sageattn_varlen(a["q"], a["k"], a["v"], a["cu_q"], a["cu_k"], a["max_q"], a["max_k"])


@pytest.mark.parametrize("case", BAD)
def test_bad_cu_seqlens_raise_naming_the_entry(case):
    overrides, exc, pattern = BAD[case]
    args = dict(_base(), **overrides)
    before = {key: x.clone() for key, x in args.items() if isinstance(x, torch.Tensor) and x.device.type != "meta"}
    with pytest.raises(exc, match=pattern):
        _call(args)
    for key, x in before.items():
        assert torch.equal(args[key], x), f"{key} was modified"


@pytest.mark.parametrize("case", ["last_past_q", "decreasing_q", "max_seqlen_q_short"])
def test_value_checks_are_one_function(case):
    """The value checks the op runs under torch.compile (check_cu_seqlens_values) are the eager ones."""
    overrides, exc, pattern = BAD[case]
    a = dict(_base(), **overrides)
    with pytest.raises(exc, match=pattern):
        inputs.check_cu_seqlens_values(a["cu_q"], a["cu_k"], a["q"].shape[0], a["k"].shape[0], a["max_q"], a["max_k"])


def test_cpu_cu_seqlens_are_checked_on_the_host_then_moved():
    """CPU cu_seqlens for inputs on another device: checked on the host (no read-back), then copied over as int32.
    The meta device stands in for a GPU here."""
    meta = torch.device("meta")
    cu_q, cu_k = cu_seqlens([4, 6], torch.int64, "cpu"), cu_seqlens([4, 6], torch.int32, "cpu")
    got = inputs.check_cu_seqlens(cu_q, cu_k, 10, 10, 6, 6, meta)
    assert all(x.device == meta and x.dtype == torch.int32 for x in got)
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[2\] \(the last entry\) is 10, but q has 12 tokens"):
        inputs.check_cu_seqlens(cu_q, cu_k, 12, 10, 6, 6, meta)
    with pytest.raises(ValueError, match=r"cu_seqlens_q is on cpu and cu_seqlens_k on meta"):
        inputs.check_cu_seqlens(cu_q, cu_k.to(meta), 10, 10, 6, 6, meta)


@pytest.mark.skipif(DEVICE.type != "cuda", reason="counts host-device synchronizations")
def test_synchronizations():
    """cu_seqlens on the GPU: one read-back for both; on the CPU: none."""
    q, k, v, cu_q, cu_k = packed([4, 6], [5, 7])

    def syncs(a, b):
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                inputs.check_cu_seqlens(a, b, 10, 12, 6, 7, q.device)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("called a synchronizing" in str(w.message) for w in seen)

    assert syncs(cu_q, cu_k) == 1
    assert syncs(cu_q.cpu(), cu_k.cpu().long()) == 0
    out = sa.sageattn_varlen(q, k, v, cu_q.cpu(), cu_k.cpu(), 6, 7)
    assert torch.equal(out, sa.sageattn_varlen(q, k, v, cu_q, cu_k, 6, 7))


# ---------------------------------------------------------------- valid batches

@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64], ids=str)
def test_uneven_batch_with_an_empty_sequence(is_causal, cu_dtype):
    """Lengths 1, 17, 0, 77: every row written and right (uninitialized rows would fail), inputs untouched."""
    lens = [1, 17, 0, 77]
    q, k, v, cu_q, cu_k = packed(lens, lens, seed=int(is_causal), cu_dtype=cu_dtype)
    before = [x.clone() for x in (q, k, v, cu_q, cu_k)]
    out = sa.sageattn_varlen(q, k, v, cu_q, cu_k, 77, 80, is_causal=is_causal)  # max_seqlen may exceed the longest
    for x, x0 in zip((q, k, v, cu_q, cu_k), before):
        assert torch.equal(x, x0) and x.dtype == x0.dtype, "an input was modified"
    check_per_sequence(out, q, k, v, cu_q, cu_k, is_causal)


@pytest.mark.parametrize("is_causal", [False, True])
def test_sequences_without_keys_or_queries(is_causal):
    """A sequence with queries but no keys gives 0 (as rows that see no key do elsewhere); one with keys but no
    queries writes nothing and does not disturb its neighbours."""
    lens_q, lens_k = [3, 17, 0, 5], [20, 0, 9, 33]
    q, k, v, cu_q, cu_k = packed(lens_q, lens_k, seed=5)
    out = sa.sageattn_varlen(q, k, v, cu_q, cu_k, 17, 33, is_causal=is_causal)
    check_per_sequence(out, q, k, v, cu_q, cu_k, is_causal)


# ---------------------------------------------------------------- torch.compile

def _varlen(q, k, v, cu_q, cu_k):
    return sa.sageattn_varlen(q, k, v, cu_q, cu_k, 17, 33)


def test_compile_fullgraph_traces_past_the_value_checks():
    """Reading cu_seqlens while tracing would break the graph: the checks must not run there."""
    torch._dynamo.reset()
    args = packed([3, 17, 5], [20, 9, 33], seed=6)
    got = torch.compile(_varlen, backend="aot_eager", fullgraph=True)(*args)
    assert torch.equal(got, _varlen(*args))


def test_compiled_call_checks_values():
    """Under torch.compile the op itself checks the offsets (tracing skipped sageattn_varlen's checks)."""
    torch._dynamo.reset()
    q, k, v, cu_q, cu_k = packed([3, 17, 5], [20, 9, 33], seed=6)
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[3\] \(the last entry\) is 20, but q has 25 tokens"):
        torch.compile(_varlen, backend="aot_eager", fullgraph=True)(q, k, v, t(0, 3, 10, 20), cu_k)
