"""sageattention/compiled_call.py and the C++ side agree: the enums of csrc/common/params.h, and the parameters of
csrc/common/binding.h's attention(). Read from the headers, no compiler needed."""
import re
from enum import IntEnum
from pathlib import Path

import pytest
import torch

from sageattention import archs, compiled_call, forward, ops
from sageattention.compiled_call import CompiledCall, Granularity, PvAccum, VMode
from sageattention.plan import Plan

CSRC = Path(__file__).resolve().parents[2] / "csrc" / "common"


def cpp_enums() -> dict:
    """{enum name: {enumerator: value}} of params.h."""
    text = (CSRC / "params.h").read_text()
    return {name: {k: int(v) for k, v in re.findall(r"(\w+)\s*=\s*(\d+)", body)}
            for name, body in re.findall(r"enum\s+(\w+)\s*:\s*int\s*\{([^}]*)\}", text)}


def python_name(enumerator: str) -> str:
    """kPerBlock -> PER_BLOCK, kAccF16Inner -> ACC_F16_INNER, kVNone -> V_NONE, kV16 -> V16."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", enumerator.removeprefix("k")).upper()


@pytest.mark.parametrize("enum", [Granularity, PvAccum, VMode])
def test_enums_match_params_h(enum):
    cpp = cpp_enums()[enum.__name__]
    assert {python_name(k): v for k, v in cpp.items()} == {m.name: m.value for m in enum}


def test_every_params_h_enum_that_crosses_is_named_in_python():
    crossing = {"DType"}  # the binding picks it from the tensors' dtype: it never crosses as an int
    named = {e.__name__ for e in vars(compiled_call).values() if isinstance(e, type) and issubclass(e, IntEnum) and e is not IntEnum}
    assert set(cpp_enums()) - crossing == named


def test_binding_takes_the_call_fields_in_order():
    text = (CSRC / "binding.h").read_text()
    params = re.search(r"std::tuple<Tensor, Tensor> attention\(([^)]*)\)", text)[1]
    names = [p.split()[-1] for p in " ".join(params.split()).split(",")]
    assert names[:3] == ["q", "k", "v"] and names[3:] == list(CompiledCall._fields[1:])


def test_op_schema_is_made_from_the_fields():
    schema = ops.compiled_attention._opoverload._schema
    assert [a.name for a in schema.arguments] == ["q", "k", "v", *CompiledCall._fields]
    assert [str(a.type) for a in schema.arguments[3:]] == \
        ["str", "bool", "bool", "int", "float", "int", "int", "bool", "bool", "bool"]


@pytest.mark.parametrize("family", list(archs.FAMILIES))
def test_each_module_operator_takes_the_fields_after_family(family):
    """torch.ops.sageattention_<family>.attention, whose CUDA kernel the module registers: declared once, in ops.py."""
    schema = getattr(torch.ops, f"sageattention_{family}").attention.default._schema
    assert [a.name for a in schema.arguments] == ["q", "k", "v", *CompiledCall._fields[1:]]
    assert [str(r.type) for r in schema.returns] == ["Tensor", "Tensor"]


def test_the_call_reaches_the_module_through_the_op_and_a_compiled_graph(monkeypatch):
    """With a stand-in module: opcheck of the op, and torch.compile(fullgraph=True) of the call as core makes it;
    the module gets the kernel arguments in order (on a GPU, test_compile.py checks the real modules)."""
    seen = []

    def attention(q, k, v, *args):
        seen.append(args)
        return [q * 2, q.new_zeros(q.shape[:3]) if args[-1] else q.new_empty(0)]

    monkeypatch.setattr(forward, "compiled_module", lambda family: type("Module", (), {"attention": attention}))
    q, k = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    call = CompiledCall("sm90", False, True, 0, 0.25, Granularity.PER_THREAD, PvAccum.ACC_TWO_LEVEL, True, False,
                        True)
    torch.library.opcheck(ops.compiled_attention, (q, k, k, *call),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    out, lse = torch.compile(lambda q, k, v: ops.run_compiled_attention(q, k, v, call), fullgraph=True)(q, k, k)
    assert torch.equal(out, q * 2) and lse.shape == (1, 2, 8)
    assert seen[-1] == call.kernel_args() == (False, True, 0, 0.25, 2, 1, True, False, True)


def test_triton_op_schema_is_made_from_its_fields_and_carries_the_plan():
    schema = ops.attention._opoverload._schema
    assert [a.name for a in schema.arguments] == ["q", "k", "v", *ops.TritonCall._fields]
    assert str(schema.arguments[3].type) == "Optional[Tensor]"
    plan = Plan("per_warp", True, True, False, True, False)
    call = ops.TritonCall(None, "HND", False, 0, 1.0, *plan.fields(), False, "")
    assert call.plan == plan
