"""backend="auto" picks a kernel that runs on every GPU and Triton we ship for (GPU, Triton and the compiled
extension mocked: this machine has no Blackwell GPU), and says what to install where none does."""
import warnings

import pytest
import torch

from sageattn3 import dispatch
from sageattn3.dispatch import choose_backend, triton_mode
from sageattn3.reference import attention_reference

CUDA = torch.device("cuda", 0)


@pytest.fixture
def gpu(monkeypatch):
    """Set the mocked GPU's capability, the installed Triton, whether _C loads and whether its self-check passes."""
    def make(capability, triton="3.6.0", extension=True, self_check=None):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Mock GPU")
        monkeypatch.setattr(dispatch, "installed_triton", lambda: triton)
        monkeypatch.setattr(dispatch, "_load_extension", lambda: object() if extension else None)
        monkeypatch.setattr(dispatch, "self_check_failure", lambda device: self_check)
        monkeypatch.delenv(dispatch.EMULATION_ENV, raising=False)
    return make


# Triton releases torch pins: 2.7 -> 3.3, 2.8 -> 3.4, 2.9 -> 3.5, 2.10/2.11 -> 3.6, 2.12/2.13 -> 3.7.
@pytest.mark.parametrize("capability, version, mode", [
    ((10, 0), "3.3.1", "native"), ((10, 0), "3.4.0", "decoded"), ((10, 0), "3.5.1", "native"),
    ((10, 0), "3.6.0", "native"), ((10, 0), "3.9.0", "native"),
    ((12, 0), "3.3.1", "decoded"), ((12, 0), "3.5.1", "decoded"), ((12, 0), "3.6.0", "native"),
    ((12, 0), "3.7.1", "native"),
    ((12, 1), "3.5.1", None), ((12, 1), "3.6.0", "decoded"), ((12, 1), "3.7.1", "decoded"),
    ((9, 0), "3.3.1", "decoded"), ((9, 0), "3.6.0", "decoded"),
    ((12, 0), "3.2.0", None), ((12, 0), None, None),
])
def test_what_each_triton_compiles_per_arch(capability, version, mode):
    assert triton_mode(capability, version) == mode


@pytest.mark.parametrize("capability", [(10, 0), (12, 0), (12, 1)])
@pytest.mark.parametrize("triton", ["3.3.1", "3.4.0", "3.6.0", None])
def test_auto_uses_the_compiled_kernels_on_blackwell_whatever_the_triton(gpu, capability, triton):
    gpu(capability, triton=triton)
    assert choose_backend(CUDA, "auto", False) == "cuda"


def test_a_failed_self_check_falls_back_to_triton(gpu):
    gpu((12, 0), triton="3.6.0", self_check="cosine 0.5")
    assert choose_backend(CUDA, "auto", False) == "triton"
    assert choose_backend(CUDA, "cuda", False) == "cuda"  # still the user's to force


@pytest.mark.parametrize("capability, triton", [((12, 0), "3.4.0"), ((10, 0), "3.4.0"), ((12, 1), "3.6.0")])
def test_triton_without_fp4_mma_runs_decoded_with_a_note(gpu, capability, triton):
    gpu(capability, triton=triton, extension=False)
    dispatch._note_decoded.cache_clear()
    with pytest.warns(RuntimeWarning, match=f"Triton {triton} cannot use the FP4 tensor cores of sm_"):
        assert choose_backend(CUDA, "auto", False) == "triton"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert choose_backend(CUDA, "auto", False) == "triton"  # said once per process


@pytest.mark.parametrize("extension, self_check, why", [
    (False, None, "this install has no compiled kernels"),
    (True, "RuntimeError: no kernel image", "the compiled kernels failed their self-check"),
])
def test_no_runnable_kernel_names_what_to_install(gpu, extension, self_check, why):
    gpu((12, 1), triton="3.5.1", extension=extension, self_check=self_check)
    with pytest.raises(RuntimeError) as err:
        choose_backend(CUDA, "auto", False)
    message = str(err.value)
    assert why in message and "Triton 3.5.1 cannot compile its Triton kernel on sm_121" in message
    assert "pip install 'triton>=3.6'" in message and "backend='reference'" in message
    gpu((12, 0), triton=None, extension=False)
    with pytest.raises(RuntimeError, match="Triton is not installed for its Triton kernel on sm_120.*'triton>=3.3'"):
        choose_backend(CUDA, "auto", False)


def test_other_gpus_are_refused_unless_emulating(gpu, monkeypatch):
    gpu((9, 0), triton="3.6.0")
    with pytest.raises(RuntimeError, match=r"Unsupported GPU: Mock GPU \(sm_90\).*sageattention.sageattn"):
        choose_backend(CUDA, "auto", False)
    assert choose_backend(CUDA, "auto", True) == "triton"  # emulation: decoded Triton, no warning needed
    with pytest.raises(RuntimeError, match="backend='cuda' needs sm_100/sm_120/sm_121; this GPU is sm_90"):
        choose_backend(CUDA, "cuda", True)


def test_explicit_backends(gpu):
    gpu((12, 0), triton="3.6.0", extension=False)
    assert choose_backend(CUDA, "triton", False) == "triton"
    assert choose_backend(CUDA, "reference", False) == "reference"
    with pytest.raises(RuntimeError, match="needs the compiled extension sageattn3._C"):
        choose_backend(CUDA, "cuda", False)
    with pytest.raises(ValueError, match="backend must be one of"):
        choose_backend(CUDA, "fast", False)


@pytest.fixture
def self_check(monkeypatch):
    """The real self-check on CPU, with the CUDA kernels replaced by `kernel`."""
    def run(kernel):
        import sageattn3.cuda_attn
        monkeypatch.setattr(sageattn3.cuda_attn, "attention_cuda", kernel)
        dispatch.self_check_failure.cache_clear()
        return dispatch.self_check_failure(torch.device("cpu"))
    yield run
    dispatch.self_check_failure.cache_clear()


def test_self_check_passes_kernels_that_match_the_reference(self_check):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert self_check(attention_reference) is None


def skewed(qi, is_causal, sm_scale, causal_offset=0):
    out, lse = attention_reference(qi, is_causal, sm_scale, causal_offset)
    return out * 1.1, lse


def broken(*args):
    raise RuntimeError("CUDA error: no kernel image is available for execution on the device")


@pytest.mark.parametrize("kernel, reason", [(skewed, "relative L1 0.1"), (broken, "RuntimeError: CUDA error: no kernel")])
def test_self_check_fails_with_a_warning_naming_the_reason(self_check, kernel, reason):
    with pytest.warns(RuntimeWarning, match=f"failed their self-check on cpu .*{reason}.*using the Triton kernel"):
        assert reason in self_check(kernel)


def test_the_extension_op_is_registered_with_a_fake_for_torch_compile():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from sageattn3 import ops  # noqa: F401 - defines the operators and their fakes
    with FakeTensorMode():
        codes = torch.empty(2, 4, 256, 64, dtype=torch.uint8)
        scales = torch.empty(2, 4, 256, 8, dtype=torch.float8_e4m3fn)
        v_codes = torch.empty(2, 4, 128, 128, dtype=torch.uint8)
        v_scales = torch.empty(2, 4, 128, 16, dtype=torch.float8_e4m3fn)
        out, lse = torch.ops.sageattn3.attention(codes, scales, codes, scales, v_codes, v_scales, None, 200,
                                                 torch.empty(3), True, 0)
        q_codes, q_scales = torch.ops.sageattn3.quantize(torch.empty(2, 3, 64))
    assert (out.shape, out.dtype, lse.shape, lse.dtype) == ((2, 4, 256, 128), torch.float32, (2, 4, 256), torch.float32)
    assert (q_codes.shape, q_codes.dtype, q_scales.shape, q_scales.dtype) == ((2, 3, 32), torch.uint8, (2, 3, 4),
                                                                              torch.float8_e4m3fn)
