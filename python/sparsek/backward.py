"""sparsek.attention_backward and AttentionBackwardPlan: the gradients of
sparsek.attention with respect to q, k and v (sk_attention_backward_*).

The backward takes what the forward returned: o and lse (lse from
attention(..., return_lse=True)), plus do = dL/do, and gives (dq, dk, dv)
with dk, dv summed over the query heads of each KV head (GQA). Same data
families as the forward: numpy arrays on the CPU backend (float16, float32,
bfloat16 through ml_dtypes), torch CPU tensors on the CPU backend, torch
CUDA tensors on the CUDA backend, whose backward kernels are not built yet
(issue 29): making a CUDA plan raises SparseKError (NOT_SUPPORTED).

AttentionBackwardPlan holds the descriptors, the layout on the data's
device, the workspace and the plan, so that a caller that runs many
backward passes on one layout (the torch autograd op to come) plans once;
run() only checks its arrays and calls sk_attention_backward_run.
Every argument is checked here before the library is called (ValueError /
TypeError); what the library finds itself raises SparseKError.
"""

from __future__ import annotations

from ctypes import byref, c_size_t, sizeof

from ._arrays import Arr, adapt, check_family, check_output, check_packed, outer_strides
from ._lib import Backend, DType, F, SkAttentionBackwardDesc, check
from .attention import _Spec, _attention_desc, _check_qkv, _empty_like


def _check_like(x, like: Arr, like_name: str, name: str, output: bool) -> Arr:
    """x has like's kind, shape, dtype and device; an output must also be
    writable (check_output)."""
    a = adapt(x, name)
    if a.kind != like.kind:
        raise TypeError(f"{name} is a {a.kind} array but {like_name} is a {like.kind} array")
    if a.shape != like.shape:
        raise ValueError(f"{name} has shape {a.shape}; it must be {like_name}'s shape {like.shape}")
    if a.dtype != like.dtype:
        raise TypeError(f"{name}.dtype = {a.dtype_name} must be {like_name}'s dtype {like.dtype_name}")
    if a.device != like.device:
        raise ValueError(f"{name} is on {a.device} but {like_name} is on {like.device}")
    if output:
        check_output(a, name)
    return a


def _check_lse(lse, aq: Arr) -> Arr:
    """lse: float32 [B, Hq, Sq], contiguous, on q's device."""
    a = adapt(lse, "lse")
    check_family((aq, a))
    B, Sq, Hq, _ = aq.shape
    if a.shape != (B, Hq, Sq):
        raise ValueError(f"lse has shape {a.shape}; it must be [B, Hq, Sq] = {(B, Hq, Sq)}")
    if a.dtype != DType.F32:
        raise TypeError(f"lse.dtype = {a.dtype_name} must be float32 (as the forward returns it)")
    if a.device != aq.device:
        raise ValueError(f"lse is on {a.device} but q is on {aq.device}")
    check_packed(a, "lse", "[B, Hq, Sq]")
    return a


class AttentionBackwardPlan:
    """A planned attention backward: both descriptors, the layout on the
    data's device, workspace and the plan (sk_attention_backward_plan),
    made once; run() then only calls sk_attention_backward_run. Inputs to
    run() must have the planned shapes, dtype and device (strides may
    differ; the last dimension is contiguous). deterministic=True (the
    default) gives bitwise repeatable gradients; False is reserved for a
    faster mode no backend has yet."""

    def __init__(self, q, k, v, layout, *, causal=False, scale=None, backend=None, deterministic=True):
        aq, ak, _ = _check_qkv(q, k, v)
        self.backend, self.desc = _attention_desc(aq, ak, layout, causal, scale, backend)
        self.layout = layout
        self.causal = bool(causal)
        self.spec = _Spec(aq.kind, aq.device, aq.dtype, aq.dtype_name, aq.shape, ak.shape)
        bwd = SkAttentionBackwardDesc()
        check(F.sk_attention_backward_desc_init(byref(bwd), sizeof(bwd)))
        bwd.deterministic = 1 if deterministic else 0
        self.bwd = bwd

        self._torch_device = None
        if self.backend == Backend.CPU:
            self.bsr = layout.view()
            self.workspace, self.workspace_size = None, 0
            check(F.sk_attention_backward_plan(byref(self.desc), byref(bwd), byref(self.bsr), None, 0, None))
            return
        import torch

        self._torch_device = q.device
        with torch.cuda.device(q.device):
            self.bsr = layout.device_view(q.device)
            size = c_size_t()
            check(F.sk_attention_backward_workspace_size(byref(self.desc), byref(bwd), byref(self.bsr), byref(size)))
            self.workspace_size = size.value
            self.workspace = torch.empty(max(size.value, 1), dtype=torch.uint8, device=q.device)
            stream = torch.cuda.current_stream(q.device).cuda_stream
            check(
                F.sk_attention_backward_plan(
                    byref(self.desc), byref(bwd), byref(self.bsr), self.workspace.data_ptr(), self.workspace_size, stream
                )
            )

    def run(self, q, k, v, o, do, lse, *, dq=None, dk=None, dv=None):
        """Enqueue sk_attention_backward_run. o and lse as the forward
        returned them for these q, k, v; do = dL/do (q's shape). dq (q's
        shape), dk and dv (k's shape) are allocated when None. Returns
        (dq, dk, dv)."""
        aq, ak, av = _check_qkv(q, k, v)
        sp = self.spec
        if (aq.kind, aq.device, aq.dtype, aq.shape, ak.shape) != (sp.kind, sp.device, sp.dtype, sp.q_shape, sp.kv_shape):
            raise ValueError(
                f"run() got q {aq.shape} / k {ak.shape} {aq.dtype_name} on {aq.device}; the plan was made "
                f"for q {sp.q_shape} / k {sp.kv_shape} {sp.dtype_name} on {sp.device}"
            )
        ao = _check_like(o, aq, "q", "o", False)
        ado = _check_like(do, aq, "q", "do", False)
        alse = _check_lse(lse, aq)
        dq = _empty_like(q, aq) if dq is None else dq
        dk = _empty_like(k, ak) if dk is None else dk
        dv = _empty_like(v, av) if dv is None else dv
        adq = _check_like(dq, aq, "q", "dq", True)
        adk = _check_like(dk, ak, "k", "dk", True)
        adv = _check_like(dv, ak, "k", "dv", True)
        desc, bwd = self.desc, self.bwd
        for field, a, name in (("q_strides", aq, "q"), ("k_strides", ak, "k"), ("v_strides", av, "v"), ("o_strides", ao, "o")):
            setattr(desc, field, outer_strides(a, name))
        for field, a, name in (("dout_strides", ado, "do"), ("dq_strides", adq, "dq"), ("dk_strides", adk, "dk"), ("dv_strides", adv, "dv")):
            setattr(bwd, field, outer_strides(a, name))
        ptrs = [a.ptr for a in (aq, ak, av, ao, ado, alse, adq, adk, adv)]
        if self.backend == Backend.CPU:
            check(F.sk_attention_backward_run(byref(desc), byref(bwd), byref(self.bsr), *ptrs, None, 0, None))
            return dq, dk, dv
        import torch

        with torch.cuda.device(self._torch_device):
            stream = torch.cuda.current_stream(self._torch_device).cuda_stream
            check(
                F.sk_attention_backward_run(
                    byref(desc), byref(bwd), byref(self.bsr), *ptrs, self.workspace.data_ptr(), self.workspace_size, stream
                )
            )
        return dq, dk, dv


def plan_attention_backward(q, k, v, layout, *, causal=False, scale=None, backend=None, deterministic=True):
    """Plan once; call .run(q, k, v, o, do, lse) as often as needed."""
    return AttentionBackwardPlan(q, k, v, layout, causal=causal, scale=scale, backend=backend, deterministic=deterministic)


def attention_backward(q, k, v, o, do, lse, layout, causal=False, scale=None, *, dq=None, dk=None, dv=None,
                       backend=None, deterministic=True):
    """Gradients of sparsek.attention with respect to q, k and v.

    q [B, Sq, Hq, D], k and v [B, Sk, Hkv, D], layout, causal and scale as
    given to the forward; o and lse [B, Hq, Sq] (float32) as the forward
    returned them (attention(..., return_lse=True)); do = dL/do, q's shape
    and dtype. Returns (dq, dk, dv) in the inputs' dtype: dq q's shape, dk
    and dv k's shape, summed over the query heads of each KV head. Rows with
    no admissible key get dq = 0; keys no row reaches get dk = dv = 0.
    dq, dk, dv: optional outputs (writable, last dimension contiguous).
    """
    plan = AttentionBackwardPlan(q, k, v, layout, causal=causal, scale=scale, backend=backend, deterministic=deterministic)
    return plan.run(q, k, v, o, do, lse, dq=dq, dk=dk, dv=dv)


__all__ = ["attention_backward", "plan_attention_backward", "AttentionBackwardPlan"]
